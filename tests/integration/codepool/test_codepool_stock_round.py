"""The stock round (codepool_stock_round): what the stock gauge and the `stock.low` repair read is
kept from what changed since the last round, not from a pass over the catalogue. A round sums the
products whose counter rows changed, re-decides their low-stock flags where a race left them wrong,
and marks the rows clean unless a change came after it read them; afterwards the summary and the
totals equal the counters, and every crossing was announced once."""
from __future__ import annotations

import asyncio
import random
import uuid

import asyncpg

from cuty.codepool.v1 import codepool_pb2 as pb
from cutylib.testing.ids import new_id

from codepool.service import ReservationService
from codepool.stock_events import StockEvents
from codepool_testkit import ADMIN, make_codes, reserve_request

ROUND = "SELECT * FROM codepool_stock_round($1)"


async def product(stub, threshold: int, stock: int) -> str:
    from cuty.common.v1 import common_pb2
    p = await stub.CreateProduct(pb.CreateProductRequest(
        sku="sku-" + new_id()[:12], name="Gift card", low_stock_threshold=threshold,
        price=common_pb2.Money(currency_code="TRY", amount_minor=500)), metadata=ADMIN)
    resp = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=p.id, batch_ref="b-" + new_id(),
                                                                codes=make_codes(stock)), metadata=ADMIN)
    assert resp.accepted
    return p.id


async def drain(pool) -> None:
    """Rounds until nothing changed is left (what earlier tests left included)."""
    while (await pool.fetchrow(ROUND, 1000))["summarised"]:
        pass


async def mismatches(pool) -> list:
    """Products whose summary differs from their counters; the totals against the summaries; flags
    that disagree with the stock."""
    wrong = [dict(r) for r in await pool.fetch("""
        SELECT p.id, t.available AS summary, coalesce(sum(s.available), 0) AS counted
        FROM products p JOIN stock_summary t ON t.merchant_id = p.merchant_id AND t.product_id = p.id
        LEFT JOIN product_stock s ON s.merchant_id = p.merchant_id AND s.product_id = p.id
        GROUP BY p.id, t.available, t.reserved, t.delivered, t.quarantined, t.revoked
        HAVING (t.available, t.reserved, t.delivered, t.quarantined, t.revoked)
               <> (coalesce(sum(s.available), 0), coalesce(sum(s.reserved), 0), coalesce(sum(s.delivered), 0),
                   coalesce(sum(s.quarantined), 0), coalesce(sum(s.revoked), 0))""")]
    totals = await pool.fetchrow("SELECT (SELECT row(available, reserved, delivered, quarantined, revoked)::text "
                                 "FROM stock_totals) AS kept, (SELECT row(sum(available), sum(reserved), "
                                 "sum(delivered), sum(quarantined), sum(revoked))::text FROM product_stock) AS counted")
    if totals["kept"] != totals["counted"]:
        wrong.append(dict(totals))
    wrong += [dict(r) for r in await pool.fetch("""
        SELECT p.id, p.stock_low FROM products p
        LEFT JOIN (SELECT product_id, sum(available) AS available FROM product_stock GROUP BY 1) s ON s.product_id = p.id
        WHERE p.stock_low <> (coalesce(s.available, 0) <= p.low_stock_threshold)""")]
    return wrong


async def test_a_round_costs_what_changed_not_the_catalogue(stub, cp_pool):
    await drain(cp_pool)
    for _ in range(3):
        await product(stub, 2, stock=10)  # a catalogue: each product summed once, then clean
    await drain(cp_pool)
    assert dict(await cp_pool.fetchrow(ROUND, 100)) == {"summarised": 0, "redecided": 0}
    assert await cp_pool.fetchval("SELECT count(*) FROM product_stock WHERE dirty") == 0
    pid = await product(stub, 2, stock=10)
    await stub.ReserveCodes(reserve_request(pid, 3))
    assert dict(await cp_pool.fetchrow(ROUND, 100)) == {"summarised": 1, "redecided": 0}
    assert await cp_pool.fetchval("SELECT available FROM stock_summary WHERE product_id = $1", uuid.UUID(pid)) == 7
    assert await mismatches(cp_pool) == []
    # a bounded round: two changed products, one per round
    other = await product(stub, 2, stock=10)
    await stub.ReserveCodes(reserve_request(pid, 1))
    assert (await cp_pool.fetchrow(ROUND, 1))["summarised"] == 1
    assert (await cp_pool.fetchrow(ROUND, 1))["summarised"] == 1
    assert (await cp_pool.fetchrow(ROUND, 1))["summarised"] == 0
    assert await cp_pool.fetchval("SELECT available FROM stock_summary WHERE product_id = $1", uuid.UUID(other)) == 10
    assert await mismatches(cp_pool) == []


async def test_a_change_in_flight_during_a_round_stays_for_the_next(stub, cp_pool, codepool_dsn):
    """A reservation not committed when the round reads and clears: its rows stay marked (held:
    SKIP LOCKED; committed after the read: another version), and the next round sums it."""
    await drain(cp_pool)
    pid = await product(stub, 2, stock=20)
    await drain(cp_pool)
    conn = await asyncpg.connect(codepool_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("UPDATE codes SET status = 'reserved' WHERE id IN (SELECT id FROM codes WHERE "
                           "product_id = $1 AND status = 'available' ORDER BY seq LIMIT 16)", uuid.UUID(pid))
        # the counter rows it changed are held: the round sees nothing changed yet, clears nothing
        await cp_pool.fetchrow(ROUND, 100)
        await tx.commit()
    finally:
        await conn.close()
    assert await cp_pool.fetchval("SELECT count(*) FROM product_stock WHERE product_id = $1 AND dirty",
                                  uuid.UUID(pid)) > 0
    await cp_pool.fetchrow(ROUND, 100)
    assert await cp_pool.fetchval("SELECT available FROM stock_summary WHERE product_id = $1", uuid.UUID(pid)) == 4
    assert await mismatches(cp_pool) == []


async def test_rounds_racing_reservations_and_releases_lose_nothing_and_announce_each_crossing_once(stub, cp_pool):
    """Buyers reserve around several products' thresholds while rounds run beside them (two at once,
    as two replicas would); then releases race the rounds. Afterwards, one more round: the
    summaries, the totals and the flags equal the counters. The stock only fell in the first phase,
    so each product crossed its threshold once or not at all: exactly one `stock.low` for each that
    ended at or below it, none for the others."""
    await drain(cp_pool)
    rng = random.Random(26)
    pids = [await product(stub, 10, stock=24) for _ in range(6)]
    svc = ReservationService(cp_pool, ttl_seconds=60)
    stop = asyncio.Event()
    held: list[str] = []

    async def rounds() -> None:
        while not stop.is_set():
            await StockEvents(cp_pool).recheck(products=2)
            await asyncio.sleep(0.005)

    async def buyer(i: int) -> None:
        for _ in range(4):
            pid = pids[(i + rng.randint(0, 1)) % len(pids)] if i % 4 else pids[0]
            try:
                r = await stub.ReserveCodes(reserve_request(pid, rng.randint(1, 3)))
            except Exception:  # out of stock: a buyer turned away
                continue
            held.append(r.order_id)

    workers = [asyncio.create_task(rounds()) for _ in range(2)]
    try:
        await asyncio.gather(*(buyer(i) for i in range(12)))
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*workers)
        await drain(cp_pool)
        assert await mismatches(cp_pool) == []
        crossed = 0
        for pid in pids:
            available = await cp_pool.fetchval("SELECT available FROM stock_summary WHERE product_id = $1",
                                               uuid.UUID(pid))
            announced = await cp_pool.fetchval("SELECT count(*) FROM stock_events WHERE product_id = $1",
                                               uuid.UUID(pid))
            assert announced == (1 if available <= 10 else 0), (pid, available)
            crossed += available <= 10
        assert crossed  # the race reached a threshold
        # releases racing the rounds: nothing lost
        stop.clear()
        workers = [asyncio.create_task(rounds()) for _ in range(2)]
        await asyncio.gather(*(svc.release(order, "system") for order in held[::2]))
    finally:
        stop.set()
        await asyncio.gather(*workers)
    await drain(cp_pool)
    assert await mismatches(cp_pool) == []
