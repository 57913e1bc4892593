"""Conservation under chaos ("Tests"): 100 codes, 64 concurrent clients reserving, releasing
and delivering at random while database backends are killed. At every read the stock adds up to 100,
every code is held by at most one order and matches its delivery, every order holds exactly its
quantity; afterwards, every delivery a client was told about is in the database, disjoint from all others.
"""
from __future__ import annotations

import asyncio
import os
import random
import secrets
import time
import uuid
from collections import Counter

import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb, codepool_pb2_grpc
from cutylib.db import create_pool
from codepool.grpc_api import CALLERS
from cutylib.testing.trust import acting_channel
from cutylib.testing.ids import new_id

from codepool.bootstrap import create_server
from codepool_testkit import STAFF, settings, stocked_product

CODES = 100
CLIENTS = 64
# Deliveries are final: past this many delivered codes, clients stop paying for new orders and
# replay old callbacks instead, so reserve / release / expiry keep churning for the whole run.
KEEP_IN_PLAY = 70
SEED = int(os.environ.get("CUTY_TEST_SEED", "20240603"))
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED}
EXPECTED = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION}

# One statement, so one snapshot: everything below must hold at every instant.
CHECK = """
WITH c AS (SELECT id, status FROM codes WHERE product_id = $1),
     a AS (SELECT code_id, order_id, status FROM deliveries WHERE product_id = $1 AND status <> 'released'),
     r AS (SELECT order_id, status, quantity FROM reservations WHERE product_id = $1)
SELECT
  (SELECT count(*) FROM c) AS total,
  (SELECT count(*) FROM c WHERE status = 'available') AS available,
  (SELECT count(*) FROM c WHERE status = 'reserved') AS reserved,
  (SELECT count(*) FROM c WHERE status = 'delivered') AS delivered,
  -- a code's status is its active delivery's (none when available)
  (SELECT count(*) FROM c LEFT JOIN a ON a.code_id = c.id
   WHERE a.status IS DISTINCT FROM nullif(c.status, 'available')) AS code_delivery_mismatch,
  (SELECT count(*) FROM (SELECT code_id FROM a GROUP BY code_id HAVING count(*) > 1) x) AS code_in_two_orders,
  (SELECT count(*) FROM (SELECT code_id FROM deliveries WHERE product_id = $1 AND status = 'delivered'
                         GROUP BY code_id HAVING count(*) > 1) x) AS delivered_twice,
  (SELECT count(*) FROM r WHERE r.status <> 'released' AND r.quantity <>
     (SELECT count(*) FROM a WHERE a.order_id = r.order_id AND a.status = r.status)) AS wrong_quantity,
  (SELECT count(*) FROM r JOIN a ON a.order_id = r.order_id WHERE r.status = 'released') AS released_but_holding
"""


async def _call(fn, req, stats: Counter, tries: int = 6, metadata=None):
    """Call until an answer that is not a database outage; a retry is a replay (every call is idempotent)."""
    for _ in range(tries):
        try:
            return await fn(req, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() not in RETRYABLE:
                raise
            stats["retried:" + e.code().name] += 1
    return None


async def run_chaos(dsn: str, cp_pool, keyring, stub, seconds: float) -> None:
    product_id, _ = await stocked_product(stub, CODES)
    # The server's own pool, recognisable by application_name: the killer terminates only its backends.
    app = "codepool-chaos-" + secrets.token_hex(4)
    pool = await create_pool(dsn, min_size=4, max_size=20, application_name=app)
    server = await create_server(settings(code_reservation_ttl_seconds=2, sweep_interval_seconds=0.2), pool,
                                 keyring=keyring)
    await server.start()
    stats: Counter = Counter()
    delivered: dict[str, tuple[str, ...]] = {}
    violations: list[dict] = []
    stop = asyncio.Event()
    try:
        async with acting_channel(f"127.0.0.1:{server.port}", "codepool", CALLERS, deadline_seconds=10) as ch:
            chaos = codepool_pb2_grpc.CodePoolServiceStub(ch)

            async def client(i: int) -> None:
                rng = random.Random(SEED * 1000 + i)
                mine: list[str] = []
                while not stop.is_set():
                    op = rng.random()
                    try:
                        if not mine or (op < 0.5 and len(mine) < 2):  # reserve; each client holds at most 2 orders
                            order_id = f"ord-{i}-{new_id()}"
                            req = pb.ReserveCodesRequest(order_id=order_id, order_item_id=order_id + "/1",
                                                         product_id=product_id, quantity=rng.randint(1, 4),
                                                         customer_id=f"c{i}")
                            if await _call(chaos.ReserveCodes, req, stats):
                                mine.append(order_id)
                                stats["reserved"] += 1
                        elif op < 0.62 and delivered and (op < 0.52 or stats["codes_delivered"] >= KEEP_IN_PLAY):
                            # replay an old payment callback: the same delivery must come back
                            order_id = rng.choice(sorted(delivered))
                            req = pb.DeliverCodesRequest(order_id=order_id, payment_transaction_id="ptx-" + order_id)
                            again = await _call(chaos.DeliverCodes, req, stats)
                            if again is not None:
                                assert tuple(again.code_ids) == delivered[order_id], "a replayed callback changed"
                                stats["replayed"] += 1
                        elif op < 0.62:  # deliver (~10%); else release (38%); the 2 s TTL expires the forgotten
                            order_id = mine.pop(rng.randrange(len(mine)))
                            req = pb.DeliverCodesRequest(order_id=order_id, payment_transaction_id="ptx-" + order_id)
                            # a third of the callbacks arrive twice at once
                            copies = 2 if rng.random() < 0.33 else 1
                            answers = await asyncio.gather(*(_call(chaos.DeliverCodes, req, stats) for _ in range(copies)),
                                                           return_exceptions=True)
                            ok = [a for a in answers if isinstance(a, pb.Reservation)]
                            assert len({tuple(a.code_ids) for a in ok}) <= 1, "duplicate callbacks disagreed"
                            if ok:
                                delivered[order_id] = tuple(ok[0].code_ids)
                                stats["delivered"] += 1
                                stats["codes_delivered"] += len(ok[0].code_ids)
                            for a in answers:
                                if isinstance(a, BaseException):
                                    raise a
                        else:
                            order_id = mine.pop(rng.randrange(len(mine)))
                            if await _call(chaos.ReleaseReservation, pb.ReleaseReservationRequest(order_id=order_id), stats):
                                stats["released"] += 1
                    except grpc.aio.AioRpcError as e:
                        if e.code() not in EXPECTED:
                            raise
                        stats[e.code().name] += 1

            async def killer() -> None:
                rng = random.Random(SEED)
                while not stop.is_set():
                    pids = [r["pid"] for r in await cp_pool.fetch(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)]
                    for pid in rng.sample(pids, min(len(pids), rng.randint(1, 3))):
                        stats["killed"] += await cp_pool.fetchval("SELECT pg_terminate_backend($1)", pid)
                    await asyncio.sleep(rng.uniform(0.05, 0.25))  # pacing of the fault injection, not a wait

            async def checker() -> None:
                while not stop.is_set():
                    row = dict(await cp_pool.fetchrow(CHECK, uuid.UUID(product_id)))
                    stats["checks"] += 1
                    bad = {k: v for k, v in row.items() if k not in ("total", "available", "reserved", "delivered") and v}
                    if row["total"] != CODES or row["available"] + row["reserved"] + row["delivered"] != CODES or bad:
                        violations.append(row)
                    # and the service's own GetStock (one statement, one snapshot) always adds up
                    stock = await _call(chaos.GetStock, pb.GetStockRequest(product_id=product_id), stats, metadata=STAFF)
                    if stock is not None and stock.available + stock.reserved + stock.delivered != CODES:
                        violations.append({"GetStock": str(stock)})
                    await asyncio.sleep(0.02)

            tasks = [asyncio.create_task(client(i)) for i in range(CLIENTS)]
            side = [asyncio.create_task(killer()), asyncio.create_task(checker())]
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end and not any(t.done() for t in tasks + side):
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*tasks, *side)  # re-raises the first unexpected error of any client
    finally:
        await server.stop()
        await pool.close()

    assert not violations, violations[:3]
    final = dict(await cp_pool.fetchrow(CHECK, uuid.UUID(product_id)))
    assert final["available"] + final["reserved"] + final["delivered"] == CODES, final
    # what clients were told matches the database, and no code went to two buyers
    rows = await cp_pool.fetch("SELECT order_id, array_agg(code_id::text ORDER BY code_id) AS codes FROM deliveries "
                               "WHERE product_id = $1 AND status = 'delivered' GROUP BY order_id", uuid.UUID(product_id))
    in_db = {r["order_id"]: tuple(r["codes"]) for r in rows}
    for order_id, codes in delivered.items():
        assert in_db.get(order_id) == tuple(sorted(codes)), order_id
    all_delivered = [c for codes in in_db.values() for c in codes]
    assert len(all_delivered) == len(set(all_delivered)) == final["delivered"]
    # the run exercised what it claims to
    assert stats["checks"] > 5 and stats["killed"] > 0, stats  # the checker ran all along (fewer rounds on a busy machine)
    assert stats["reserved"] > 0 and stats["delivered"] > 0 and stats["released"] > 0, stats
    assert stats["replayed"] > 0, stats
    print(f"chaos {seconds}s: {dict(stats)}; final {final}")


async def test_conservation_short_seeded(codepool_dsn, cp_pool, keyring, stub):
    await run_chaos(codepool_dsn, cp_pool, keyring, stub, seconds=6)


@pytest.mark.slow
async def test_conservation_20s(codepool_dsn, cp_pool, keyring, stub):
    await run_chaos(codepool_dsn, cp_pool, keyring, stub, seconds=20)
