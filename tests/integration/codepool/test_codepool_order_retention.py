"""Retention of finished orders (docs/codepool.md, "Retention"), on a database of its own: the
migrations keep the orders there were; the retention job moves finished orders (the reservation
with its deliveries and payment transactions) into the time-partitioned order history in bounded
batches; DeliverCodes, ReleaseReservation, the buyer's codes, the incident story and the auditor's
digest answer as before for a moved order; an order with an unresolved claim stays; no row leaves
by a DELETE; a history partition past the retention leaves whole (archived first) while the
delivered code stays findable; the mover racing buyers, payments, releases and claims loses
nothing and never delivers a code twice (checked in the database afterwards); the mover's
statements walk partial indexes, so their cost is their batch."""
from __future__ import annotations

import asyncio
import csv
import dataclasses
import datetime as dt
import pathlib
import random
import shutil
import uuid

import asyncpg
import grpc
import pytest
import pytest_asyncio

from codepool import digest, incident
from codepool.bootstrap import ORDER_HISTORIES, codepool_retention, create_codepool_pool, create_server
from codepool.grpc_api import CALLERS
from codepool_testkit import STAFF, reserve_request, settings, stocked_product
from cuty.codepool.v1 import codepool_pb2 as pb
from cuty.codepool.v1 import codepool_pb2_grpc
from cutylib import digests
from cutylib.config import Settings, with_database
from cutylib.grpc_errors import error_reason
from cutylib.db import migrate
from cutylib.retention import Move, Retention, Table
from cutylib.testing.ids import new_id
from cutylib.testing.postgres import service_dsn
from cutylib.testing.retention import columns, moving
from cutylib.testing.tenancy import PARTITIONS_WITHOUT_RLS
from cutylib.testing.trust import acting_channel

REPO = pathlib.Path(__file__).resolve().parents[3]
MIGRATIONS = REPO / "services" / "codepool" / "migrations"
HISTORY_MIGRATIONS = ("0270_order_history.sql", "0271_reservations_delivered.sql",
                      "0272_reservations_released.sql", "0273_payment_transactions_by_order.sql")
# Every finished order, whatever its age: the mover's cutoff ten years ahead.
EVERYTHING = Move("reservations", "reservations_move", -3650)
CLAIM = "SELECT (codepool_claim_open($1, $2, $3, NULL, NULL, 'does_not_work', 'it fails', 'tests')).id"


@dataclasses.dataclass
class Pool:
    owner: asyncpg.Connection
    admin: asyncpg.Pool        # the superuser: past Row-Level Security (the digest's and ops' reads)
    service: asyncpg.Pool      # the service's role, as in production
    stub: codepool_pb2_grpc.CodePoolServiceStub
    before: dict               # orders made before the history's migrations: name -> (order, txn, codes)
    keyring: object


async def _serve(dsn, keyring):
    pool = await create_codepool_pool(dsn, dataclasses.replace(Settings(), db_pool_min=2, db_pool_max=16))
    server = await create_server(settings(sweep_interval_seconds=3600), pool, keyring=keyring)
    await server.start()
    channel = acting_channel(f"127.0.0.1:{server.port}", "codepool", CALLERS, deadline_seconds=30)
    return pool, server, channel, codepool_pb2_grpc.CodePoolServiceStub(channel)


async def _stop(pool, server, channel):
    await channel.close()
    await server.stop()
    await pool.close()


async def deliver(stub, order_id: str, txn: str):
    return await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=order_id, payment_transaction_id=txn))


async def codes_of(stub, order_id: str, customer_id: str) -> dict[str, str]:
    got = await stub.GetDeliveredCodes(pb.GetDeliveredCodesRequest(order_id=order_id, customer_id=customer_id))
    return {c.id: c.value for c in got.codes}


@pytest_asyncio.fixture
async def db(pg, keyring, tmp_path):
    """A code pool database migrated up to the order history, with a delivered and a released order
    made by the service then; then migrated whole and served again."""
    before = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, before, ignore=shutil.ignore_patterns(*HISTORY_MIGRATIONS))
    dsn = with_database(pg.dsn, f"codepool_orders_{uuid.uuid4().hex[:10]}")
    await migrate(dsn, before)
    as_service = await service_dsn(pg.dsn, "codepool", dsn)
    old = await _serve(as_service, keyring)
    stub = old[3]
    product_id, _ = await stocked_product(stub, 20)
    made = {}
    for name in ("delivered", "released"):
        req = reserve_request(product_id, 2)
        res = await stub.ReserveCodes(req)
        txn = "txn-" + new_id()
        if name == "delivered":
            await deliver(stub, req.order_id, txn)
        else:
            await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=req.order_id))
        made[name] = (req, txn, sorted(res.code_ids))
    await _stop(*old[:3])
    assert await migrate(dsn, MIGRATIONS) == [m.removesuffix(".sql") for m in HISTORY_MIGRATIONS]
    pool, server, channel, stub = await _serve(as_service, keyring)
    made["delivered_codes"] = await codes_of(stub, made["delivered"][0].order_id, made["delivered"][0].customer_id)
    owner = await asyncpg.connect(dsn)
    admin = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    yield Pool(owner, admin, pool, stub, made, keyring)
    await admin.close()
    await owner.close()
    await _stop(pool, server, channel)


async def where(owner, order_id: str) -> list[str]:
    return [r["t"] for r in await owner.fetch(
        "SELECT 'live' AS t FROM reservations WHERE order_id = $1 "
        "UNION ALL SELECT 'history' FROM reservations_history WHERE order_id = $1", order_id)]


async def refused(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code(), error_reason(e.value)


async def test_finished_orders_move_with_their_rows_and_read_as_before(db, tmp_path):
    stub = db.stub
    (old_req, old_txn, old_codes), (rel_req, _, _) = db.before["delivered"], db.before["released"]
    # The migration kept them, live.
    assert await where(db.owner, old_req.order_id) == ["live"] and await where(db.owner, rel_req.order_id) == ["live"]
    product_id, _ = await stocked_product(stub, 20)
    claimed = reserve_request(product_id, 1)
    claimed_codes = (await stub.ReserveCodes(claimed)).code_ids
    await deliver(stub, claimed.order_id, "txn-" + new_id())
    assert await db.admin.fetchval(CLAIM, uuid.uuid4(), claimed.order_id, uuid.UUID(claimed_codes[0]))
    live = reserve_request(product_id, 1)
    await stub.ReserveCodes(live)
    first_answer = await deliver(stub, old_req.order_id, old_txn)  # a replay, before the move

    # Not finished long enough (the default): nothing moves.
    assert (await codepool_retention(db.service).round()).moved == {"reservations": 0}
    done = await Retention(db.service, [], None, [EVERYTHING], batch=1, limit=10).round()
    assert done.moved == {"reservations": 2}
    assert await where(db.owner, old_req.order_id) == ["history"]
    assert await where(db.owner, rel_req.order_id) == ["history"]
    assert await where(db.owner, claimed.order_id) == ["live"]  # an unresolved claim keeps its order live
    assert await where(db.owner, live.order_id) == ["live"]     # reserved: not finished
    for table in ("deliveries", "payment_transactions"):
        assert await db.owner.fetchval(f"SELECT count(*) FROM {table} WHERE order_id = $1", old_req.order_id) == 0
    assert await db.owner.fetchval("SELECT count(*) FROM deliveries_history WHERE order_id = $1",
                                   old_req.order_id) == 2
    assert await db.owner.fetchval("SELECT outcome FROM payment_transactions_history WHERE transaction_id = $1",
                                   old_txn) == "delivered"
    assert await db.owner.fetch(PARTITIONS_WITHOUT_RLS) == []

    # Reads and replays answer as before; nothing is written for a moved order.
    assert await deliver(stub, old_req.order_id, old_txn) == first_answer
    assert await codes_of(stub, old_req.order_id, old_req.customer_id) == db.before["delivered_codes"]
    assert await refused(deliver(stub, old_req.order_id, "txn-" + new_id())) == (
        grpc.StatusCode.FAILED_PRECONDITION, "order-already-delivered")
    assert await refused(deliver(stub, rel_req.order_id, "txn-" + new_id())) == (
        grpc.StatusCode.FAILED_PRECONDITION, "reservation-lost")
    assert await refused(stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=old_req.order_id))) == (
        grpc.StatusCode.FAILED_PRECONDITION, "order-delivered")
    released = await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=rel_req.order_id))
    assert released.status == pb.RESERVATION_STATUS_RELEASED and not released.code_ids
    assert await where(db.owner, rel_req.order_id) == ["history"]
    # Past the claims window (moved): a claim on its code is refused as a missing code.
    assert await db.admin.fetchval(CLAIM, uuid.uuid4(), old_req.order_id, uuid.UUID(old_codes[0])) is None
    # The ops lookup by order and by code, and the auditor's digest, find it.
    story = await incident.look_up(db.admin, db.keyring, old_req.order_id, by="tests")
    assert story.matched == "order id" and story.order["status"] == "delivered"
    assert sorted(c.code["id"] for c in story.codes) == old_codes
    assert all([d["order_id"] for d in c.deliveries] == [old_req.order_id] for c in story.codes)
    story = await incident.look_up(db.admin, db.keyring, old_codes[0], by="tests")
    assert [d["order_status"] for d in story.codes[0].deliveries] == ["delivered"]
    now = dt.datetime.now(dt.timezone.utc)
    orders, dups, _ = await digest.digest_deliveries(db.admin, now - dt.timedelta(hours=1), now, 100, "")
    by_id = {o.order_id: o for o in orders}
    assert by_id[old_req.order_id].delivered == 2 and by_id[claimed.order_id].delivered == 1 and dups == []
    # The auditor's summary of the window sums the same orders, moved and live alike (no code shared).
    n = 64
    expected: dict[int, list[int]] = {}
    for o in orders:
        x = expected.setdefault(digests.bucket_of(o.order_id, n), [0, 0])
        x[0] += 1
        x[1] = (x[1] + digests.fingerprint_of(o.order_id, o.merchant_id, o.delivered + o.revoked - o.replaced, 0)) \
            % digests.MOD
    summed = await digest.summarize_deliveries(db.admin, now - dt.timedelta(hours=1), now, n)
    assert {b.bucket: [b.count, b.fingerprint] for b in summed} == expected

    # No row leaves by a DELETE or changes once moved.
    for sql in ("DELETE FROM reservations_history WHERE order_id = $1", "DELETE FROM deliveries_history WHERE order_id = $1",
                "DELETE FROM payment_transactions_history WHERE order_id = $1",
                "UPDATE reservations_history SET status = 'released' WHERE order_id = $1"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await db.owner.execute(sql, old_req.order_id)
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await db.owner.execute("DELETE FROM payment_transactions WHERE order_id = $1", claimed.order_id)

    # Past the history's retention its first partition leaves whole, archived first; the delivered
    # codes stay (the buyer's codes by id, the duplicate check), and ops still find them.
    upper = await db.owner.fetchval("SELECT min(upper) FROM cuty_partition_bounds('reservations_history')")
    days = -((upper - now).days + 1)
    done = await Retention(db.service, [Table(t, days) for t in ORDER_HISTORIES], tmp_path).round()
    assert sorted(done.dropped) == sorted(f"{t}_legacy" for t in ORDER_HISTORIES)
    with open(tmp_path / "reservations_history" / "reservations_history_legacy.csv", newline="") as f:
        assert {r["order_id"]: r["status"] for r in csv.DictReader(f)} == {
            old_req.order_id: "delivered", rel_req.order_id: "released"}
    with open(tmp_path / "deliveries_history" / "deliveries_history_legacy.csv", newline="") as f:
        assert sorted(r["code_id"] for r in csv.DictReader(f) if r["status"] == "delivered") == old_codes
    assert await db.owner.fetchval("SELECT count(*) FROM codes WHERE id = ANY($1::uuid[]) AND status = 'delivered'",
                                   old_codes) == 2
    story = await incident.look_up(db.admin, db.keyring, old_codes[0], by="tests")
    assert story.matched == "code id" and story.codes[0].code["status"] == "delivered"
    stock = await stub.GetStock(pb.GetStockRequest(product_id=old_req.product_id), metadata=STAFF)
    assert (stock.available, stock.reserved, stock.delivered) == (18, 0, 2)


async def test_the_histories_have_every_column_of_their_live_tables_in_order(db):
    for live in ("reservations", "deliveries", "payment_transactions"):
        moved = [("moved_at", "timestamp with time zone")]
        assert await columns(db.owner, f"{live}_history") == await columns(db.owner, live) + moved
        assert await columns(db.owner, f"{live}_all") == await columns(db.owner, live) + moved


async def test_the_mover_racing_buyers_payments_releases_and_claims_loses_nothing(db):
    stub = db.stub
    product_id, _ = await stocked_product(stub, 120)
    rnd = random.Random(26)
    orders = [reserve_request(product_id, rnd.choice((1, 2))) for _ in range(40)]
    answers: dict[str, list] = {o.order_id: [] for o in orders}
    claims: set[str] = set()

    async def buyer(share):
        for o in share:
            res = await stub.ReserveCodes(o)
            txn = "txn-" + o.order_id
            if rnd.random() < 0.2:
                await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=o.order_id))
            for _ in range(rnd.choice((1, 2, 3))):  # the payment's callback, replayed
                try:
                    answers[o.order_id].append(sorted((await deliver(stub, o.order_id, txn)).code_ids))
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
                    answers[o.order_id].append(None)
                await asyncio.sleep(0)
            if answers[o.order_id][0] and rnd.random() < 0.3:
                if await db.admin.fetchval(CLAIM, uuid.uuid4(), o.order_id, uuid.UUID(res.code_ids[0])):
                    claims.add(o.order_id)

    async with moving(Retention(db.service, [], None, [EVERYTHING], batch=3, limit=30), "reservations") as mover:
        await asyncio.gather(*(buyer(orders[i::4]) for i in range(4)))
    moved = mover["moved"] + (await Retention(db.service, [], None, [EVERYTHING], batch=100).round()).moved[
        "reservations"]

    ids = [o.order_id for o in orders]
    places = {i: await where(db.owner, i) for i in ids}
    assert all(len(p) == 1 for p in places.values()), places  # in exactly one place
    assert {i for i, p in places.items() if p == ["live"]} == claims  # only claimed orders stay
    assert moved == len(ids) - len(claims) + 2  # and the two finished orders the fixture made
    rows = await db.owner.fetch("""
        SELECT r.order_id, r.status, r.quantity,
               (SELECT array_agg(d.code_id::text ORDER BY d.code_id) FROM deliveries_all d
                 WHERE d.order_id = r.order_id AND d.status = 'delivered') AS delivered
        FROM reservations_all r WHERE r.order_id = ANY($1::text[])""", ids)
    for r in rows:
        got = answers[r["order_id"]]
        if r["status"] == "delivered":
            # every answer of its payment the same codes, and exactly those delivered
            assert all(a == got[0] for a in got) and got[0] == sorted(r["delivered"]), (r, got)
            assert len(r["delivered"]) == r["quantity"]
        else:
            assert got == [None] * len(got) and r["delivered"] is None
    # No code in two orders' deliveries (delivered), live or moved; the counters agree with the codes.
    assert await db.owner.fetch("""
        SELECT code_id FROM deliveries_all WHERE product_id = $1 AND status = 'delivered'
        GROUP BY code_id HAVING count(*) > 1""", uuid.UUID(product_id)) == []
    counted = await db.owner.fetchrow(
        "SELECT sum(delivered) AS delivered, sum(reserved) AS reserved FROM product_stock WHERE product_id = $1",
        uuid.UUID(product_id))
    assert counted["delivered"] == await db.owner.fetchval(
        "SELECT count(*) FROM codes WHERE product_id = $1 AND status = 'delivered'", uuid.UUID(product_id)) == sum(
        r["quantity"] for r in rows if r["status"] == "delivered")
    assert counted["reserved"] == 0


MOVER_PICKS = (
    "SELECT r.order_id FROM reservations r WHERE r.status = 'delivered' AND r.delivered_at < now() "
    "ORDER BY r.delivered_at LIMIT 500 FOR UPDATE OF r SKIP LOCKED",
    "SELECT r.order_id FROM reservations r WHERE r.status = 'released' AND r.released_at < now() "
    "ORDER BY r.released_at LIMIT 500 FOR UPDATE OF r SKIP LOCKED",
    "SELECT * FROM payment_transactions WHERE merchant_id = 'm' AND order_id = 'o'",
    "SELECT * FROM reservations_history WHERE order_id = 'o'",
    # reservations_move's own statements: the picked orders' children by order, the orders by row id
    "DELETE FROM deliveries d USING unnest('{m}'::text[], '{o}'::text[]) o (merchant_id, order_id) "
    "WHERE d.merchant_id = o.merchant_id AND d.order_id = o.order_id",
    "DELETE FROM payment_transactions t USING unnest('{m}'::text[], '{o}'::text[]) o (merchant_id, order_id) "
    "WHERE t.merchant_id = o.merchant_id AND t.order_id = o.order_id",
    "DELETE FROM reservations r WHERE r.ctid = ANY ('{\"(0,1)\"}'::tid[])",
)


async def test_the_movers_statements_walk_partial_indexes_whatever_the_table(db):
    """Plans with sequential scans off, as on a grown table: each pick is an index scan of the
    finished orders' partial indexes, and an order's payment transactions are found by index."""
    async with db.admin.acquire() as conn:
        await conn.execute("SET enable_seqscan = off")
        for sql, index in zip(MOVER_PICKS, ("reservations_delivered", "reservations_released",
                                            "payment_transactions_by_order", "reservations_history",
                                            "deliveries_by_order", "payment_transactions_by_order", "Tid Scan")):
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql))
            assert index in plan and "Sort" not in plan and "Seq Scan" not in plan, plan
        # The readers of both: the digest's page merges the two digest indexes in key order; a code's
        # orders and an order's deliveries are index probes on each side (a partition's copy of the
        # history's index is named after its columns).
        now = dt.datetime.now(dt.timezone.utc)
        for sql, args, indexes in (
                (digest.ORDERS, (now - dt.timedelta(hours=1), now, None, None, 1001, 0, []),
                 ("reservations_digest", "reservations_history_legacy_reserved_at_order_id_idx", "Merge Append")),
                (incident.DELIVERIES, ("m", uuid.uuid4(), 500),
                 ("deliveries_by_code", "deliveries_history_legacy_merchant_id_code_id_idx")),
                (incident.ORDER_CODES, ("m", "o", 51),
                 ("deliveries_by_order", "deliveries_history_legacy_merchant_id_order_id_idx"))):
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *args))
            assert all(i in plan for i in indexes) and "Seq Scan" not in plan, plan


def test_the_retention_settings_are_refused_below_their_minimums(monkeypatch):
    """The claims window (orders move no sooner than 30 days after they finished) and the chargeback
    window (the history is kept at least 400 days after the move; 0: forever)."""
    monkeypatch.setenv("CUTY_RESERVATIONS_MOVE_AFTER_DAYS", "29")
    with pytest.raises(ValueError, match="CUTY_RESERVATIONS_MOVE_AFTER_DAYS"):
        codepool_retention(None)
    monkeypatch.setenv("CUTY_RESERVATIONS_MOVE_AFTER_DAYS", "30")
    monkeypatch.setenv("CUTY_CODEPOOL_HISTORY_RETENTION_DAYS", "399")
    with pytest.raises(ValueError, match="CUTY_CODEPOOL_HISTORY_RETENTION_DAYS"):
        codepool_retention(None)
    for days in ("0", "400"):
        monkeypatch.setenv("CUTY_CODEPOOL_HISTORY_RETENTION_DAYS", days)
        job = codepool_retention(None)
        assert {t.name: t.retention_days for t in job.tables if t.name in ORDER_HISTORIES} == {
            t: int(days) for t in ORDER_HISTORIES}
        assert [(m.function, m.after_days) for m in job.moves] == [("reservations_move", 30)]
