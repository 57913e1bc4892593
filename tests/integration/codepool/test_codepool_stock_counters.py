"""Stock counters (product_stock, docs/codepool.md "Stock counters"): kept by the statements that
change codes, they equal a real count of the codes per product and state at every snapshot, under
real concurrency: reserve, deliver (with a late re-take), release, expiry, import, deletion of
available codes and a rotation-like rewrite, at random, from many connections at once."""
from __future__ import annotations

import asyncio
import os
import pathlib
import random
import shutil
import uuid

import asyncpg
import prometheus_client
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from cutylib.db import migrate
from cutylib.errors import DomainError
from cutylib.testing.ids import new_id

from codepool import metrics
from codepool.domain import ReserveCommand
from codepool.service import ReservationService
from codepool.stock_events import StockEvents
from codepool_testkit import ADMIN, make_codes, new_product, stock_of, stocked_product

SEED = int(os.environ.get("CUTY_TEST_SEED", "20261202"))
WORKERS = 12
OPS_PER_WORKER = 30

# One statement, one snapshot: the counters against a count of the codes, per product and state.
# A row is a (product, state) where they disagree.
MISMATCHES = """
WITH counted AS (
    SELECT c.product_id, s.state, count(*) FILTER (WHERE c.status = s.state) AS n
    FROM codes c CROSS JOIN (VALUES ('available'), ('reserved'), ('delivered'), ('quarantined'), ('revoked')) s(state)
    WHERE c.product_id = ANY($1::uuid[]) GROUP BY 1, 2
), kept AS (
    SELECT k.product_id, s.state,
           sum(CASE s.state WHEN 'available' THEN k.available WHEN 'reserved' THEN k.reserved
                            WHEN 'delivered' THEN k.delivered WHEN 'quarantined' THEN k.quarantined
                            ELSE k.revoked END) AS n
    FROM product_stock k CROSS JOIN (VALUES ('available'), ('reserved'), ('delivered'), ('quarantined'),
                                            ('revoked')) s(state)
    WHERE k.product_id = ANY($1::uuid[]) GROUP BY 1, 2
)
SELECT coalesce(c.product_id, k.product_id) AS product_id, coalesce(c.state, k.state) AS state,
       c.n AS counted, k.n AS kept
FROM counted c FULL JOIN kept k ON k.product_id = c.product_id AND k.state = c.state
WHERE c.n IS DISTINCT FROM k.n
"""


async def _mismatches(conn, products: list[uuid.UUID]) -> list[dict]:
    return [dict(r) for r in await conn.fetch(MISMATCHES, products)]


async def test_counters_equal_a_count_under_random_concurrent_changes(stub, cp_pool):
    products = [uuid.UUID((await stocked_product(stub, 40))[0]) for _ in range(3)]
    # claims quarantine a batch after a few, racing the other changes (docs/codepool.md, "Batch quarantine")
    await cp_pool.execute("UPDATE products SET claim_quarantine_threshold = 3 WHERE id = ANY($1)", products)
    # A TTL this short makes reservations due while the run goes on, so the expiry races the rest.
    service = ReservationService(cp_pool, ttl_seconds=0.3, max_active=100, max_quantity=100)
    orders: list[str] = []
    stats: dict[str, int] = {}
    stop = asyncio.Event()

    async def reserve(rng: random.Random) -> None:
        order = "ord-" + new_id()
        await service.reserve(ReserveCommand(order, order + "/1", rng.choice(products), rng.randint(1, 6),
                                             "cust-" + new_id()), "system")
        orders.append(order)

    async def deliver(rng: random.Random) -> None:
        if orders:  # a reservation that lapsed is taken up again if stock allows (the late payment)
            await service.deliver(rng.choice(orders), "tx-" + new_id(), "system")

    async def release(rng: random.Random) -> None:
        if orders:
            await service.release(rng.choice(orders), "system")

    async def expire(rng: random.Random) -> None:
        await service.expire_due(rng.randint(1, 20))

    async def import_codes(rng: random.Random) -> None:
        resp = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(
            product_id=str(rng.choice(products)), batch_ref="b-" + new_id(), codes=make_codes(rng.randint(1, 30))),
            metadata=ADMIN)
        assert resp.accepted

    async def delete_available(rng: random.Random) -> None:
        # codes never ordered (a delivery, even a released one, keeps its code)
        await cp_pool.execute("DELETE FROM codes c WHERE id IN (SELECT id FROM codes c WHERE product_id = $1 AND "
                              "status = 'available' AND NOT EXISTS (SELECT FROM deliveries d WHERE d.code_id = c.id) "
                              "ORDER BY seq DESC LIMIT $2 FOR UPDATE SKIP LOCKED)", rng.choice(products), rng.randint(1, 3))

    async def rewrite(rng: random.Random) -> None:
        # a change that is no status change (as a key rotation's): counts nothing
        await cp_pool.execute("UPDATE codes SET key_id = key_id WHERE id IN (SELECT id FROM codes WHERE "
                              "product_id = $1 ORDER BY random() LIMIT 20 FOR UPDATE SKIP LOCKED)", rng.choice(products))

    async def claim_and_replace(rng: random.Random) -> None:
        # a claim on a delivered code (it may quarantine its batch), then its replacement, each in its
        # own transaction as the service does (docs/codepool.md, "Claims"): two codes change
        claim = await cp_pool.fetchval(
            "SELECT c.id FROM (SELECT order_id, code_id FROM deliveries WHERE product_id = $1 AND status = 'delivered' "
            "ORDER BY random() LIMIT 1) d, codepool_claim_open(gen_random_uuid(), d.order_id, d.code_id, NULL, NULL, "
            "'does_not_work', 'random', 'system') c", rng.choice(products))
        if claim is not None:
            await cp_pool.execute("SELECT codepool_claim_replace($1, NULL, 'system', NULL)", claim)

    async def batch_decision(rng: random.Random) -> None:
        # a batch held back, released or retired ("Batch quarantine"): many codes in one statement
        step = rng.choice(["quarantine", "quarantine", "release", "retire"])
        batch = await cp_pool.fetchrow("SELECT merchant_id, product_id, id FROM supplier_batches WHERE product_id = $1 "
                                       "ORDER BY random() LIMIT 1", rng.choice(products))
        if step == "quarantine":
            await cp_pool.execute("SELECT codepool_batch_quarantine($1, $2, $3, 'system', '{}')", *batch)
        else:
            await cp_pool.execute("SELECT codepool_batch_release($1, $2, $3, $4, 'system', NULL)", *batch, step)

    ops = [(reserve, 6), (deliver, 3), (release, 2), (expire, 2), (import_codes, 1), (delete_available, 1),
           (rewrite, 1), (claim_and_replace, 2), (batch_decision, 1)]

    async def worker(i: int) -> None:
        rng = random.Random(SEED * 100 + i)
        for _ in range(OPS_PER_WORKER):
            op = rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
            try:
                await op(rng)
                stats[op.__name__] = stats.get(op.__name__, 0) + 1
            except DomainError:  # out of stock, delivered already, lapsed: the counters must hold anyway
                stats["refused"] = stats.get("refused", 0) + 1
            except asyncpg.PostgresError as e:  # a claim open already, no code to replace with, ...
                assert (getattr(e, "sqlstate", "") or "").startswith("CP0"), e
                stats["refused"] = stats.get("refused", 0) + 1
            if rng.random() < 0.2:
                await asyncio.sleep(rng.random() * 0.1)

    async def check_while_running() -> int:
        """The counters equal the count at every snapshot, not only at the end."""
        checks = 0
        async with cp_pool.acquire() as conn:
            while not stop.is_set():
                assert await _mismatches(conn, products) == []
                checks += 1
                await asyncio.sleep(0.05)
        return checks

    checker = asyncio.create_task(check_while_running())
    try:
        await asyncio.gather(*(worker(i) for i in range(WORKERS)))
    finally:
        stop.set()
    assert await checker > 3
    assert stats.get("reserve", 0) > 20 and stats.get("deliver", 0) and stats.get("import_codes", 0), stats
    assert stats.get("claim_and_replace", 0) and stats.get("batch_decision", 0), stats
    assert await cp_pool.fetchval("SELECT count(*) FROM code_claims WHERE product_id = ANY($1) AND status = 'replaced'",
                                  products) > 0
    assert await cp_pool.fetchval("SELECT count(*) FROM supplier_batches WHERE product_id = ANY($1) AND status <> 'active'",
                                  products) > 0
    while await service.expire_due(500):  # whatever is left due
        pass
    assert await _mismatches(cp_pool, products) == []
    for p in products:  # the read paths answer the counted figures
        counted = await cp_pool.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'available') AS a, count(*) FILTER (WHERE status = 'reserved') AS r, "
            "count(*) FILTER (WHERE status = 'delivered') AS d FROM codes WHERE product_id = $1", p)
        assert await stock_of(stub, str(p)) == (counted["a"], counted["r"], counted["d"])


async def test_one_counter_row_update_per_product_and_slot_whatever_the_batch(stub, cp_pool):
    """A statement changing many codes updates each counter row once (statement-level triggers):
    1,000 codes reserved by one UPDATE update at most 16 counter rows, one per slot."""
    product_id, _ = await stocked_product(stub, 1000)
    pid = uuid.UUID(product_id)
    async with cp_pool.acquire() as conn:
        async with conn.transaction():
            # this backend's row updates of product_stock not reported yet (read inside one transaction)
            updated = "SELECT pg_stat_get_xact_tuples_updated('product_stock'::regclass)"
            before = await conn.fetchval(updated)
            n = await conn.fetchval("WITH u AS (UPDATE codes SET status = 'reserved' WHERE product_id = $1 "
                                    "RETURNING 1) SELECT count(*) FROM u", pid)
            assert n == 1000
            assert 1 <= await conn.fetchval(updated) - before <= 16
            assert await stock_of(stub, product_id) == (1000, 0, 0)  # not committed: others see the old stock
        assert await stock_of(stub, product_id) == (0, 1000, 0)


async def test_a_missing_counter_row_fails_the_statement_instead_of_losing_the_change(stub, cp_pool):
    """Counters never silently drift: a code changing state with no counter row to take it from is
    refused by the row's CHECK (available >= 0)."""
    product_id, _ = await stocked_product(stub, 3)
    pid = uuid.UUID(product_id)
    async with cp_pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute("DELETE FROM product_stock WHERE product_id = $1", pid)  # a lost row
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute("UPDATE codes SET status = 'reserved' WHERE id = (SELECT id FROM codes "
                                   "WHERE product_id = $1 LIMIT 1)", pid)
        finally:
            await tx.rollback()


async def test_the_migration_counts_the_codes_already_there(scratch_db, tmp_path):
    """A database holding codes before the counters existed gets them counted by the migration."""
    migrations = pathlib.Path(__file__).resolve().parents[3] / "services" / "codepool" / "migrations"
    # The schema before the counters: the baseline, and the functions but the one whose SQL body
    # names product_stock (checked when created; the others are PL/pgSQL, checked when they run)
    # and the claims' ones, which name the later table code_claims.
    older = tmp_path / "before-0002"
    shutil.copytree(migrations, older, ignore=lambda d, names: [
        n for n in names if n == "codepool_stock_available.sql" or n.startswith("codepool_claim_")
        or (n[:4].isdigit() and n >= "0002")])
    await migrate(scratch_db, older)
    conn = await asyncpg.connect(scratch_db)
    try:
        products = {"m1": uuid.uuid4(), "m2": uuid.uuid4()}
        async with conn.transaction():
            # codes as an older release wrote them, with no counting trigger to run
            await conn.execute("SET LOCAL session_replication_role = replica")
            for merchant, pid in products.items():
                bid = uuid.uuid4()
                await conn.execute("INSERT INTO products (id, merchant_id, sku, name, price_minor, currency) "
                                   "VALUES ($1, $2, 's', 'n', 1, 'TRY')", pid, merchant)
                await conn.execute("INSERT INTO supplier_batches (id, merchant_id, product_id, batch_ref, received, "
                                   "imported, content_digest, actor) VALUES ($1, $2, $3, 'b', 1, 1, $4, 't')",
                                   bid, merchant, pid, os.urandom(32))
                await conn.execute(
                    "INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash, "
                    "status, reserved_at, delivered_at) "
                    "SELECT gen_random_uuid(), $1, $2, $3, 'k', substr(sha256(g::text::bytea), 1, 12), "
                    "sha256(g::text::bytea), sha256(($1 || g)::bytea), s, "
                    "CASE WHEN s <> 'available' THEN now() END, CASE WHEN s = 'delivered' THEN now() END "
                    "FROM generate_series(1, 500) g, "
                    "LATERAL (SELECT (ARRAY['available', 'reserved', 'delivered'])[1 + g % 3] AS s) x",
                    merchant, pid, bid)
        assert await conn.fetchval("SELECT to_regclass('product_stock')") is None
        await migrate(scratch_db, migrations)
        assert await _mismatches(conn, list(products.values())) == []
        assert await conn.fetchval("SELECT sum(available + reserved + delivered) FROM product_stock") == 1000
    finally:
        await conn.close()


async def test_the_stock_gauge_reads_the_counters(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 5)
    empty = await new_product(stub)
    service = ReservationService(cp_pool, ttl_seconds=60)
    for _ in range(2):
        order = "ord-" + new_id()
        await service.reserve(ReserveCommand(order, order + "/1", uuid.UUID(product_id), 1, "cust-" + new_id()), "system")
    await service.deliver(order, "tx-" + new_id(), "system")
    await StockEvents(cp_pool).recheck()  # the stock round the code pool runs every few seconds
    gauge = metrics.CodePoolMetrics(prometheus_client.CollectorRegistry())
    await gauge.refresh_stock(cp_pool, top=1_000_000)  # every product of the shared database shown
    seen = {state: gauge.value("cuty_codepool_codes", product_id=product_id, state=state)
            for state in ("available", "reserved", "delivered")}
    assert seen == {"available": 3, "reserved": 1, "delivered": 1}
    assert {state: gauge.value("cuty_codepool_codes", product_id=empty, state=state)
            for state in ("available", "reserved", "delivered")} == {"available": 0, "reserved": 0, "delivered": 0}


async def test_the_stock_gauge_shows_the_products_nearest_to_running_out_and_sums_the_rest(stub, cp_pool):
    """A bounded label: `top` products (fewest available first, never stocked last), the rest as
    product_id="other"; per state, the series add up to the whole stock."""
    await stocked_product(stub, 1)
    await stocked_product(stub, 3)
    await new_product(stub)  # never stocked
    await StockEvents(cp_pool).recheck()  # the stock round the code pool runs every few seconds
    stocked = {str(r["product_id"]): r["available"] for r in await cp_pool.fetch(
        "SELECT product_id, sum(available) AS available FROM product_stock GROUP BY product_id "
        "HAVING sum(available + reserved + delivered) > 0")}
    totals = await cp_pool.fetchrow("SELECT sum(available) AS available, sum(reserved) AS reserved, "
                                    "sum(delivered) AS delivered, sum(quarantined) AS quarantined, "
                                    "sum(revoked) AS revoked FROM product_stock")
    registry = prometheus_client.CollectorRegistry()
    gauge = metrics.CodePoolMetrics(registry)
    for top in (2, 1):  # fewer shown the second time: the others' series are removed
        await gauge.refresh_stock(cp_pool, top=top)
        series = {(s.labels["product_id"], s.labels["state"]): s.value
                  for f in registry.collect() if f.name == "cuty_codepool_codes" for s in f.samples}
        shown = {pid for pid, _ in series} - {metrics.OTHER}
        assert len(shown) == top and metrics.OTHER in {pid for pid, _ in series}
        assert shown <= set(stocked)  # two stocked products at least: no never-stocked one shown
        hidden = set(stocked) - shown
        assert max(stocked[p] for p in shown) <= min(stocked[p] for p in hidden)
        for state in metrics.STATES:
            assert sum(v for (_, st), v in series.items() if st == state) == totals[state], state
