"""What a year of sales costs every path (`make bench-growth`): the three databases grown to a
year of a busy platform, measured beside empty ones in the same run.

Filled in SQL (bench/growth_fill.py: generate_series, minutes, not hours) at BENCH_GROWTH_SCALE
of the sizes a year gives (1.0: 1,001 merchants; 10 M codes, one product with 5 M; 5 M holds;
5 M checkouts with their payments; 20 M payment events; ~1 M merchant events and their deliveries).
BENCH_GROWTH_FAST=1 is a quick try (scale 0.005, one short round).

1. The code pool, in process (BENCH_GROWTH_PARTS has "pool"): on the grown database, the big
   product (5 M codes at scale 1, 90 % sold over the year) beside a product of 5,000 codes, rounds
   alternated: ReserveCodes (qty 1 and 10, 8 in flight, each released 200 reservations later, not
   timed; first in each round, after a VACUUM of the last round's churn, in TURNS short turns with
   each product first in every other one), a statement changing 1,000 codes (counters' trigger on and off), GetStock and the count it
   replaced, ListCodes pages (first and middle, values decrypted), the reservation sweeper (batches
   of 500 and of its default; releases/s), the stock round (the first, summing every product; with
   nothing changed; after 1 and 100 products changed), the stock gauge, and the passes over every
   product's counters they replaced.
2. The platform (BENCH_GROWTH_PARTS has "stack"): two whole stacks as deployed (mutual TLS, the
   services as their own database roles), one on the grown databases, one on empty ones, rounds
   alternated:
   - hot paths: a booking and a code purchase to COMPLETED (CreateCheckout, PayCheckout: the hold
     or reservation, the checkout, the payment, the PSP's synchronous capture and its webhook,
     the finalize), 8 buyers; HoldSlot and ReserveCodes (+ release) direct, 8 in flight; after an
     unmeasured warm-up of both stacks, each path in TURNS short turns a round, each stack first in
     every other turn;
   - merchant reads, one at a time, as the merchant's admin: GetStock, ListCheckouts pages (no
     filter, each filter, and the second page), a salon's day (ListBookings), a payment timeline;
   - periodic work: every statement the stacks ran (sweepers, saga workers, reconciler, relay,
     gauges, purges; intervals shortened to seconds) from pg_stat_statements, per database, grown
     beside empty.
   WAL written per purchase (pg_current_wal_lsn before and after each purchase run) and the size
   of each database per checkout go to the sizing figures (docs/deploy.md).

Before measuring, the retention movers (cutylib.retention; MOVERS) drain the grown databases as a
year of the retention job would have left them: finished holds and outbound events in their
time-partitioned histories, each batch timed (a periodic statement). The fill already put the
holds that finished over 30 days ago in their history, so the holds mover moves the last weeks'. The stacks run the retention
job every 5 s, so its rounds are among the periodic statements.

At the end, one PASS/FAIL line per target and figure (`targets`): merchant reads p99 <= 50 ms
(grown), hot paths grown / empty >= 0.9, periodic work p99 and its statements' EXPLAIN <= 100 ms,
periodic plans flat (the grown plan's pages within 4x + 50 of the empty one's), and every statement
the grown stack ran (pg_stat_statements): its pages a row (per row answered or changed, at least
one a call) flat against the empty stack's by the same rule, and, when one of its calls took over
100 ms, its mean within 100 ms (the call's maximum printed beside the empty stack's).

EXPLAIN (ANALYZE, BUFFERS) of the reads and the periodic statements: bench/results/growth-plans.txt;
the statements: bench/results/growth-statements.txt; figures: bench/results/growth.json.
"""
from __future__ import annotations

import asyncio
import collections
import datetime as dt
import os
import pathlib
import re
import tempfile
import time
import uuid

import asyncpg
import prometheus_client

from _common import RESULTS, ROOT, Run, bench_postgres, closed_loop, merged, report

import growth_fill
from cutylib import retention
from cutylib.config import with_database
from cutylib.db import create_pool, migrate
from cutylib.principal import Principal
from codepool import catalog, metrics, repository
from codepool.domain import ReserveCommand
from codepool.keys import Keyring
from codepool.service import ReservationService
from codepool import stock_events, workers
from codepool.stock_events import StockEvents
from codepool.bootstrap import ORDERS_MOVE_BATCH

FAST = os.environ.get("BENCH_GROWTH_FAST", "") not in ("", "0")
SCALE = float(os.environ.get("BENCH_GROWTH_SCALE", "0.005" if FAST else "0.1"))
PARTS = os.environ.get("BENCH_GROWTH_PARTS", "pool,stack").split(",")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1" if FAST else "2"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "2" if FAST else "6"))
# Turns a round of each hot path (in process and on the stacks), SECONDS / 2 each, and the
# unmeasured warm-up before them.
TURNS = int(os.environ.get("BENCH_TURNS", "2" if FAST else "6"))
WARMUP_SECONDS = 2 if FAST else 5
# The stacks' purchases, before `checkout` reads them.
# (HoldSlot alone ran ~500/s on a lightly loaded machine and the empty stack ran out of 6,500.)
os.environ.setdefault("BENCH_SLOTS", str(int((ROUNDS * TURNS * SECONDS / 2 + WARMUP_SECONDS) * 1500) + 1000))
os.environ.setdefault("BENCH_SECONDS", str(SECONDS))

SMALL_CODES = 5_000
ROUND_PRODUCTS = stock_events.ROUND_PRODUCTS_DEFAULT
SWEEP_BATCH = workers.SWEEP_BATCH_DEFAULT
CUSTOMERS = growth_fill.CUSTOMERS
IN_FLIGHT = 8
# In-process ReserveCodes: each reservation is released this many reservations later (reserve_round).
RELEASE_LAG = 200
PAGE = 50
PLANS = RESULTS / "growth-plans.txt"
STATEMENTS = RESULTS / "growth-statements.txt"
SERVICES = ("booking", "codepool", "payments")

FILL_CODES = """
INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash, status, created_at)
SELECT md5($4 || g)::uuid, $1, $2, $3, 'k', substr(decode(md5(g::text), 'hex'), 1, 12),
       decode(md5(g::text) || md5(g::text), 'hex'), decode(md5($4 || g) || md5(g::text), 'hex'), 'available',
       clock_timestamp()
FROM generate_series(1, $5::bigint) g
"""


class Product:
    def __init__(self, name: str, merchant: str, codes: int, product_id: uuid.UUID | None = None):
        self.name, self.merchant, self.codes = name, merchant, codes
        self.id = product_id or uuid.uuid4()
        self.tag = name[:1] + uuid.uuid4().hex[:6]
        self.staff = Principal("staff-" + merchant, "staff", merchant)
        self.middle: uuid.UUID | None = None  # a ListCodes cursor half-way through the product's codes


async def fill_small(conn: asyncpg.Connection, p: Product) -> None:
    """A product of `p.codes` available codes, written as the importer writes them (triggers on)."""
    batch = uuid.uuid4()
    await conn.execute("INSERT INTO products (id, merchant_id, sku, name, price_minor, currency, low_stock_threshold) "
                       "VALUES ($1, $2, $3, $3, 500, 'TRY', 10)", p.id, p.merchant, p.name)
    await conn.execute("INSERT INTO supplier_batches (id, merchant_id, product_id, batch_ref, received, imported, "
                       "content_digest, actor) VALUES ($1, $2, $3, 'year', $4, $4, $5, 'bench')",
                       batch, p.merchant, p.id, p.codes, os.urandom(32))
    await conn.execute(FILL_CODES, p.merchant, p.id, batch, p.tag, p.codes)


# The statements GetStock and the stock gauge ran before the stock counters: a count of the codes.
COUNTED_STOCK = """
SELECT p.id, p.merchant_id,
       count(c.id) FILTER (WHERE c.status = 'available') AS available,
       count(c.id) FILTER (WHERE c.status = 'reserved')  AS reserved,
       count(c.id) FILTER (WHERE c.status = 'delivered') AS delivered
FROM products p LEFT JOIN codes c ON c.merchant_id = p.merchant_id AND c.product_id = p.id
WHERE p.id = $1 AND ($2::text IS NULL OR p.merchant_id = $2)
GROUP BY p.id
"""
# The stock gauge and the `stock.low` recheck before the stock rounds: each one pass over every
# product's counter rows (product_stock, 16 rows per product).
GAUGE_OVER_COUNTERS = """
WITH stock AS (
    SELECT p.id, coalesce(c.available, 0) AS available, coalesce(c.reserved, 0) AS reserved,
           coalesce(c.delivered, 0) AS delivered, coalesce(c.quarantined, 0) AS quarantined,
           coalesce(c.revoked, 0) AS revoked
    FROM products p
    LEFT JOIN (SELECT merchant_id, product_id, sum(available) AS available, sum(reserved) AS reserved,
                      sum(delivered) AS delivered, sum(quarantined) AS quarantined, sum(revoked) AS revoked
               FROM product_stock GROUP BY merchant_id, product_id) c
           ON c.merchant_id = p.merchant_id AND c.product_id = p.id
), ranked AS (
    SELECT *, row_number() OVER (ORDER BY available + reserved + delivered = 0, available, id) AS rank FROM stock
)
SELECT CASE WHEN rank <= $1 THEN id::text ELSE 'other' END AS product_id,
       sum(available)::bigint AS available, sum(reserved)::bigint AS reserved, sum(delivered)::bigint AS delivered,
       sum(quarantined)::bigint AS quarantined, sum(revoked)::bigint AS revoked
FROM ranked GROUP BY 1
"""
RECHECK_OVER_COUNTERS = """
SELECT pr.merchant_id, pr.id FROM products pr
LEFT JOIN (SELECT s.merchant_id, s.product_id, sum(s.available) AS available FROM product_stock s
           GROUP BY s.merchant_id, s.product_id) st ON st.merchant_id = pr.merchant_id AND st.product_id = pr.id
WHERE pr.stock_low <> (coalesce(st.available, 0) <= pr.low_stock_threshold)
ORDER BY pr.id
"""
COUNTED_GAUGE = """
SELECT p.id::text AS product_id, s.state, count(c.id) AS n
FROM products p
CROSS JOIN (VALUES ('available'), ('reserved'), ('delivered')) AS s(state)
LEFT JOIN codes c ON c.product_id = p.id AND c.status = s.state
GROUP BY p.id, s.state
"""

async def encrypt_pages(conn: asyncpg.Connection, keyring: Keyring, p: Product) -> None:
    """The codes of ListCodes' first page and of a page from the middle, encrypted for real."""
    p.middle = await conn.fetchval("SELECT id FROM codes WHERE merchant_id = $1 AND product_id = $2 ORDER BY id "
                                   "OFFSET $3 LIMIT 1", p.merchant, p.id, p.codes // 2)
    for after in (uuid.UUID(int=0), p.middle):
        ids = await conn.fetch(catalog.LIST_CODES, p.merchant, p.id, after, PAGE)
        for r in ids:
            key_id, nonce, ct = keyring.encrypt(r["id"].bytes, p.id.bytes, f"BENCH-{r['id'].hex[:12]}")
            await conn.execute("UPDATE codes SET key_id = $2, nonce = $3, ciphertext = $4 WHERE id = $1",
                               r["id"], key_id, nonce, ct)


async def explain(conn: asyncpg.Connection, title: str, sql: str, *args) -> str:
    rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", *args)
    return f"-- {title}\n" + "\n".join("    " + r[0] for r in rows) + "\n"


async def timed(op, n: int) -> Run:
    """`op()` n times, one at a time."""
    return await closed_loop(lambda i: op(), concurrency=1, total=n)



async def pool_part(dsn: str, conn: asyncpg.Connection, big: Product, small: Product):
    """The code pool's use cases in process, the big product beside the small one (docstring, 1.)."""
    keyring = Keyring(keys={"b1": os.urandom(32)}, active="b1", hash_key=os.urandom(32))
    for p in (big, small):
        await encrypt_pages(conn, keyring, p)
    pool = await create_pool(dsn, min_size=IN_FLIGHT, max_size=IN_FLIGHT + 4)
    service = ReservationService(pool, ttl_seconds=900)
    shop = catalog.Catalog(pool, keyring)
    runs: dict[str, list[Run]] = {}
    customers = iter(range(10**9))

    def add(name: str, run: Run) -> None:
        runs.setdefault(name, []).append(run)

    async def reserve(p: Product, quantity: int) -> str:
        i = next(customers)
        order = f"bench-{p.tag}-{quantity}-{i}"
        # customers with a history on the big product (their delivered orders are what the caps skip)
        await service.reserve(ReserveCommand(order, order + "/1", p.id, quantity, f"cust-{i % CUSTOMERS}"), "bench")
        return order

    async def reserve_round(p: Product, quantity: int, seconds: float = SECONDS) -> Run:
        """Reservations, each released RELEASE_LAG reservations later (the rest after the round);
        the latencies are the reservations' alone. Released at once, the same few codes would come
        back to the head of the queue again and again, and where their counter slots happen to
        fall (codepool_stock_slot: concurrent reservations of one product wait on the slots they
        share) would decide the product's figure; over a window of RELEASE_LAG reservations'
        codes, each product's reservations meet the slots as any buyer's do."""
        latencies: list[float] = []
        available = await conn.fetchval("SELECT sum(available) FROM product_stock WHERE product_id = $1", p.id)
        lag = max(1, min(RELEASE_LAG, available // (2 * quantity)))
        held: collections.deque[str] = collections.deque()

        async def cycle(i: int) -> None:
            t0 = time.perf_counter()
            order = await reserve(p, quantity)
            latencies.append((time.perf_counter() - t0) * 1000)
            held.append(order)
            if len(held) > lag:
                await service.release(held.popleft(), "bench")

        run = await closed_loop(cycle, concurrency=IN_FLIGHT, duration=seconds)
        run.latencies_ms = latencies
        while held:
            await service.release(held.popleft(), "bench")
        return run

    async def changed_rounds(n: int, times: int) -> Run:
        """Rounds, each after `n` products' counter rows changed (marked as a change marks them, not
        timed); the latencies are the rounds' alone."""
        latencies: list[float] = []

        async def cycle(i: int) -> None:
            await conn.execute("UPDATE product_stock SET dirty = true WHERE product_id IN "
                               "(SELECT id FROM products ORDER BY id LIMIT $1)", n)
            t0 = time.perf_counter()
            await StockEvents(pool).recheck()
            latencies.append((time.perf_counter() - t0) * 1000)

        run = await closed_loop(cycle, concurrency=1, total=times)
        run.latencies_ms = latencies
        return run

    async def batch(p: Product) -> None:
        async with pool.acquire() as c:
            ids = await c.fetchval("WITH u AS (UPDATE codes SET status = 'reserved' WHERE id IN (SELECT id FROM codes "
                                   "WHERE merchant_id = $1 AND product_id = $2 AND status = 'available' ORDER BY seq "
                                   "LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING id) SELECT array_agg(id) FROM u",
                                   p.merchant, p.id)
            await c.execute("UPDATE codes SET status = 'available' WHERE id = ANY($1::uuid[])", ids)

    try:
        # Unmeasured, both products, then analysed: the first reservations after the fill's VACUUM
        # ANALYZE ran on plans made from statistics with no live reservation (twice the pages a
        # call until autovacuum's analyse), and that fell on whichever product was measured first.
        for p in (big, small):
            for qty in (1, 10):
                await reserve_round(p, qty, WARMUP_SECONDS)
        await conn.execute("ANALYZE reservations, deliveries, codes")
        for rnd in range(ROUNDS):
            # The reservations of both products come first in each round, from the same state: the
            # dead rows of the last round's 1,000-code batches vacuumed (not timed). Left to
            # autovacuum, its pass over `codes` fell on whichever product's reservations came next
            # (a run measured the big product 1.6 times the small one's rate). Each product goes
            # first in every other turn, TURNS short turns a round: one turn of 6 s a round put the
            # big product at 0.87 of the small one's rate in a run of 2 rounds and at 1.04 in a run
            # of 4, and single turns of one run ranged 0.6-1.3 (autovacuum, every 5 s here, takes a
            # share of the 2 cores whenever it wakes): short turns spread that over both alike.
            await conn.execute("VACUUM codes, reservations, product_stock")
            for turn in range(TURNS):
                for p in ((big, small) if turn % 2 == 0 else (small, big)):
                    for qty in (1, 10):
                        run = await reserve_round(p, qty, SECONDS / 2)
                        add(f"ReserveCodes qty {qty} (+ release), {p.name}", run)
                        print(f"  round {rnd + 1}, turn {turn + 1}: ReserveCodes qty {qty}, {p.name}: "
                              f"{run.ops_per_s:,.0f}/s", flush=True)
            for p in ((big, small) if rnd % 2 == 0 else (small, big)):
                add(f"1,000 codes reserved + released (2 statements), counted, {p.name}",
                    await closed_loop(lambda i, p=p: batch(p), concurrency=1, duration=SECONDS))
                await conn.execute("ALTER TABLE codes DISABLE TRIGGER codes_stock_after_update")
                try:
                    add(f"1,000 codes reserved + released (2 statements), not counted, {p.name}",
                        await closed_loop(lambda i, p=p: batch(p), concurrency=1, duration=SECONDS))
                finally:
                    await conn.execute("ALTER TABLE codes ENABLE TRIGGER codes_stock_after_update")
                add(f"GetStock, {p.name}", await closed_loop(
                    lambda i, p=p: shop.stock(p.staff, p.id, "bench"), concurrency=1, duration=SECONDS))
                add(f"GetStock by count (before), {p.name}", await timed(
                    lambda p=p: pool.fetchrow(COUNTED_STOCK, p.id, p.merchant), 5 if p is big else 50))
                add(f"ListCodes first page ({PAGE}), {p.name}", await closed_loop(
                    lambda i, p=p: shop.list_codes(p.staff, p.id, uuid.UUID(int=0), PAGE, "bench"),
                    concurrency=1, duration=SECONDS))
                add(f"ListCodes middle page ({PAGE}), {p.name}", await closed_loop(
                    lambda i, p=p: shop.list_codes(p.staff, p.id, p.middle, PAGE, "bench"),
                    concurrency=1, duration=SECONDS))
            gauge = metrics.CodePoolMetrics(prometheus_client.CollectorRegistry())
            # The stock round (codepool_stock_round): the first after the upgrade sums every product
            # once, in rounds of ROUND_PRODUCTS; then a round costs the products changed since.
            if "stock round, first (every product)" not in runs:
                add("stock round, first (every product)", await closed_loop(
                    lambda i: pool.fetchrow("SELECT * FROM codepool_stock_round($1)", ROUND_PRODUCTS),
                    concurrency=1, total=-(-await conn.fetchval("SELECT count(*) FROM products") // ROUND_PRODUCTS)))
            add("stock round, nothing changed", await timed(lambda: StockEvents(pool).recheck(), 20))
            for n_changed in (1, ROUND_PRODUCTS):
                add(f"stock round, {n_changed} products changed", await changed_rounds(n_changed, 10))
            add("stock gauge refresh", await timed(lambda: gauge.refresh_stock(pool), 20))
            add("stock gauge over every product's counters (before)", await timed(
                lambda: pool.fetch(GAUGE_OVER_COUNTERS, 50), 20))
            add("stock.low recheck's pass over every product's counters (before)", await timed(
                lambda: pool.fetch(RECHECK_OVER_COUNTERS), 20))
            add("stock gauge by count (before)", await timed(lambda: pool.fetch(COUNTED_GAUGE), 3))
            add("sweeper idle round", await timed(lambda: service.expire_due(SWEEP_BATCH), 50))
        sweeps = {}
        # The sweeper on 2,000 reservations of each product, made due: in batches of 500 (before) and
        # of the sweeper's batch (CUTY_CODE_SWEEP_BATCH's default); releases per second of each.
        for p in (big, small):
            for size in (500, SWEEP_BATCH):
                await closed_loop(lambda i, p=p: reserve(p, 1), concurrency=IN_FLIGHT, total=2000)
                n = await conn.fetchval("WITH u AS (UPDATE reservations SET expires_at = clock_timestamp() - "
                                        "interval '1 s' WHERE merchant_id = $1 AND status = 'reserved' RETURNING 1) "
                                        "SELECT count(*) FROM u", p.merchant)
                t0 = time.perf_counter()
                run = await closed_loop(lambda i, size=size: service.expire_due(size), concurrency=1,
                                        total=-(-n // size))
                seconds = time.perf_counter() - t0
                sweeps[f"{p.name}, batches of {size}"] = {"released": n, "seconds": round(seconds, 2),
                                                          "releases_per_s": round(n / seconds)}
                add(f"sweeper batch of {size}{'' if size == SWEEP_BATCH else ' (before)'}, {p.name}", run)
                print(f"  swept {n:,} {p.name} reservations in batches of {size} in {seconds:.2f}s "
                      f"({n / seconds:,.0f} releases/s)", flush=True)

        plans = [await explain(conn, f"GetStock, {p.name}", catalog.STOCK, p.id, p.merchant) for p in (big, small)]
        plans += [await explain(conn, f"GetStock by count (before), {p.name}", COUNTED_STOCK, p.id, p.merchant)
                  for p in (big, small)]
        plans += [await explain(conn, f"ListCodes middle page, {p.name}", catalog.LIST_CODES, p.merchant, p.id,
                                p.middle, PAGE) for p in (big, small)]
        plans.append(await explain(conn, "stock gauge", metrics.STOCK_BY_PRODUCT, 50))
        plans.append(await explain(conn, "stock gauge over every product's counters (before)", GAUGE_OVER_COUNTERS, 50))
        plans.append(await explain(conn, "stock gauge by count (before)", COUNTED_GAUGE))
        plans.append(await explain(conn, "OutOfStock's count, big", repository.COUNT_AVAILABLE, big.id))
        plans.append(await explain(conn, "sweeper claim (idle)", repository.CLAIM_EXPIRED, SWEEP_BATCH))
        plans.append(await explain(
            conn, "per-customer cap count, a customer with history on the big product",
            "SELECT count(*), coalesce(sum(r.quantity) FILTER (WHERE r.product_id = $2), 0) FROM reservations r "
            "WHERE r.customer_id = $1 AND r.status = 'reserved' AND r.expires_at > clock_timestamp()", "cust-7", big.id))
        plans.append(await explain(
            conn, "reserve's pick, big", "SELECT id FROM codes WHERE merchant_id = $1 AND product_id = $2 AND "
            "status = 'available' ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED", big.merchant, big.id))
        return runs, plans, sweeps
    finally:
        await pool.close()


# --- the platform: two stacks, grown and empty --------------------------------------------------

STACK_ENV = {
    # The periodic work runs every few seconds instead of minutes, so the measured rounds see it.
    "CUTY_SWEEP_INTERVAL_SECONDS": 2,
    "CUTY_RETENTION_INTERVAL_SECONDS": 5,
}
# Every statement the services ran, per database (the extension is loaded by `statements_on`).
STATEMENT_STATS = """
SELECT d.datname AS db, s.calls, s.total_exec_time, s.mean_exec_time, s.max_exec_time, s.rows,
       s.shared_blks_hit + s.shared_blks_read AS pages,
       CASE WHEN s.toplevel THEN '' ELSE '(nested) ' END || s.query AS query
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = ANY($1::text[]) AND s.query NOT ILIKE 'EXPLAIN%' AND s.calls > 0
"""


async def statements_on(server) -> bool:
    """pg_stat_statements on the throwaway cluster (a restart to load it); False on a given server."""
    admin = await asyncpg.connect(server.dsn)
    try:
        if getattr(server, "cluster", None) is not None:
            await admin.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            await admin.execute("ALTER SYSTEM SET autovacuum_naptime = '5s'")
            await admin.close()
            server.cluster.stop()
            server.cluster.start()
            admin = await asyncpg.connect(server.dsn)
            # The statements inside the services' functions too, each under its own text (marked
            # nested): a function call's pages are its statements' pages, and these say which one.
            # (A setting of the library: known only once the restart has loaded it.)
            await admin.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
            await admin.execute("SELECT pg_reload_conf()")
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return True
    except asyncpg.PostgresError as e:
        print(f"no pg_stat_statements ({e}): the periodic statements are not listed")
        return False
    finally:
        await admin.close()


class Site:
    """What one stack's reads read: a product, a salon and its busiest day, a payment."""

    def __init__(self, product: str, salon: str, day: str, payment: str, checkout_product: str):
        self.product, self.salon, self.day, self.payment = product, salon, day, payment
        self.checkout_product = checkout_product


async def grown_site(big_product: uuid.UUID, dsns: dict[str, str]) -> Site:
    b = await asyncpg.connect(dsns["booking"])
    p = await asyncpg.connect(dsns["payments"])
    try:
        salon = await b.fetchval("SELECT id FROM salons WHERE merchant_id = 'merchant-test' ORDER BY created_at LIMIT 1")
        # Most of a year's bookings are in the history by now (drain_movers): a day of theirs, a
        # week and more ago, so the read is served by holds_history.
        day = await b.fetchval(
            "SELECT (start_time AT TIME ZONE 'Europe/Istanbul')::date FROM holds_history WHERE salon_id = $1 AND "
            "status = 'confirmed' AND start_time < now() - interval '9 days' GROUP BY 1 ORDER BY count(*) DESC, 1 DESC "
            "LIMIT 1", salon) or await b.fetchval(
            "SELECT (start_time AT TIME ZONE 'Europe/Istanbul')::date FROM holds WHERE salon_id = $1 AND status = "
            "'confirmed' GROUP BY 1 ORDER BY count(*) DESC, 1 DESC LIMIT 1", salon)
        payment = await p.fetchval("SELECT id FROM payments WHERE merchant_id = 'merchant-test' "
                                   "ORDER BY created_at LIMIT 1 OFFSET (SELECT count(*) / 2 FROM payments "
                                   "WHERE merchant_id = 'merchant-test')")
    finally:
        await b.close()
        await p.close()
    return Site(str(big_product), str(salon), day.isoformat(), str(payment), str(big_product))


async def empty_site(side, dsns: dict[str, str]) -> Site:
    b = await asyncpg.connect(dsns["booking"])
    p = await asyncpg.connect(dsns["payments"])
    try:
        salon, day = await b.fetchrow(
            "SELECT salon_id, (start_time AT TIME ZONE 'Europe/Istanbul')::date FROM holds WHERE status = 'confirmed' "
            "GROUP BY 1, 2 ORDER BY count(*) DESC LIMIT 1")
        payment = await p.fetchval("SELECT id FROM payments ORDER BY created_at DESC LIMIT 1")
    finally:
        await b.close()
        await p.close()
    return Site(side.products[-1], str(salon), day.isoformat(), str(payment), side.products[-1])


def hot_paths(side, product: str):
    """The hot paths of one stack: two purchases to COMPLETED, HoldSlot and ReserveCodes direct."""
    from checkout import bpb, buyer, cpb

    async def hold(i: int) -> None:
        key = uuid.uuid4().hex
        await side.booking.HoldSlot(bpb.HoldSlotRequest(slot_id=next(side.slot_iter), customer_id=f"h-{key}",
                                                        request_id=key), timeout=10)

    async def reserve(i: int) -> None:
        key = uuid.uuid4().hex
        await side.codepool.ReserveCodes(cpb.ReserveCodesRequest(order_id=key, order_item_id=key, product_id=product,
                                                                 quantity=1, customer_id=f"r-{key}"), timeout=10)
        await side.codepool.ReleaseReservation(cpb.ReleaseReservationRequest(order_id=key), timeout=10)

    return {
        "booking purchase -> COMPLETED (create + pay)": buyer("booking", "two-call", side, product, []),
        "code purchase -> COMPLETED (create + pay)": buyer("codes", "two-call", side, product, []),
        "HoldSlot": hold,
        "ReserveCodes (+ release, both timed)": reserve,
    }


def merchant_reads(side, site: Site, payments_stub):
    from checkout import ADMIN, cpb, pb
    from cuty.booking.v1 import booking_pb2 as bpb
    from cuty.payments.v1 import payments_pb2 as ppb
    from cutylib.timestamps import to_timestamp

    now = dt.datetime.now(dt.timezone.utc)
    lists = {
        "no filter": pb.ListCheckoutsRequest(page_size=PAGE),
        "salon": pb.ListCheckoutsRequest(salon_id=site.salon, page_size=PAGE),
        "product": pb.ListCheckoutsRequest(product_id=site.checkout_product, page_size=PAGE),
        "state EXPIRED": pb.ListCheckoutsRequest(state=pb.CHECKOUT_STATE_EXPIRED, page_size=PAGE),
        "state COMPLETED": pb.ListCheckoutsRequest(state=pb.CHECKOUT_STATE_COMPLETED, page_size=PAGE),
        "created in a month 6 months ago": pb.ListCheckoutsRequest(
            created_after=to_timestamp(now - dt.timedelta(days=200)),
            created_before=to_timestamp(now - dt.timedelta(days=170)), page_size=PAGE),
    }
    reads = {"GetStock": lambda i: side.codepool.GetStock(cpb.GetStockRequest(product_id=site.product),
                                                          metadata=ADMIN, timeout=10)}
    for name, req in lists.items():
        reads[f"ListCheckouts page ({PAGE}), {name}"] = (
            lambda i, req=req: side.api.ListCheckouts(req, metadata=ADMIN, timeout=10))
    second = {}

    async def next_page(i: int) -> None:
        if "token" not in second:
            first = await side.api.ListCheckouts(lists["no filter"], metadata=ADMIN, timeout=10)
            second["token"] = first.next_page_token
        await side.api.ListCheckouts(pb.ListCheckoutsRequest(page_size=PAGE, page_token=second["token"]),
                                     metadata=ADMIN, timeout=10)
    reads[f"ListCheckouts second page ({PAGE})"] = next_page
    reads["a salon's day (ListBookings, 50)"] = lambda i: side.booking.ListBookings(
        bpb.ListBookingsRequest(salon_id=site.salon, day=site.day, page_size=PAGE), metadata=ADMIN, timeout=10)
    reads["a payment's timeline page"] = lambda i: payments_stub.GetPaymentTimeline(
        ppb.GetPaymentTimelineRequest(payment_id=site.payment, page_size=100), metadata=ADMIN, timeout=10)
    return reads


async def wal_lsn(conn: asyncpg.Connection):
    return await conn.fetchval("SELECT pg_current_wal_lsn()")


async def stack_part(server, work: str, grown_dsns: dict[str, str], empty_dsns: dict[str, str],
                     big_product: uuid.UUID, statements: bool):
    from checkout import Side
    from cuty.payments.v1 import payments_pb2_grpc
    from cutylib.testing.trust import acting_channel
    from payments.grpc_api import CALLERS as PAYMENT_CALLERS

    sides = {}
    for name, dsns in (("grown", grown_dsns), ("empty", empty_dsns)):
        s = Side(server, os.path.join(work, name), secure=True)
        s.dbs = dict(dsns)
        s.stack.env.update({f"CUTY_{k.upper()}_DATABASE_URL": v for k, v in dsns.items()})
        s.stack.env.update({k: str(v) for k, v in STACK_ENV.items()})
        sides[name] = s
    runs: dict[str, list[Run]] = {}
    wal: dict[str, list[tuple[int, int]]] = {}
    admin = await asyncpg.connect(server.dsn)
    try:
        n_slots = int(os.environ["BENCH_SLOTS"])
        for s in sides.values():
            await s.start(n_slots, 1)
        ch = {n: acting_channel(s.stack.payments_addrs[0], "payments", PAYMENT_CALLERS, secure=True)
              for n, s in sides.items()}
        stubs = {n: payments_pb2_grpc.PaymentServiceStub(c) for n, c in ch.items()}
        # A first purchase of each kind on the empty stack, so it has a payment and a salon's day to read.
        for path in ("booking purchase -> COMPLETED (create + pay)", "code purchase -> COMPLETED (create + pay)"):
            await closed_loop(hot_paths(sides["empty"], sides["empty"].products[-1])[path], concurrency=2, total=20)
        sites = {"grown": await grown_site(big_product, grown_dsns), "empty": await empty_site(sides["empty"], empty_dsns)}
        # Buy from the stack's own imported product: the grown one's sits among 10 M codes.
        paths = {name: hot_paths(side, side.products[-1]) for name, side in sides.items()}
        # Unmeasured, both stacks alike (first calls: plans, channels, caches).
        for name in sides:
            for op in paths[name].values():
                await closed_loop(op, concurrency=IN_FLIGHT, duration=WARMUP_SECONDS / 2)
        if statements:
            await admin.execute("SELECT pg_stat_statements_reset()")
        for rnd in range(ROUNDS):
            # Each hot path on both stacks in TURNS short turns, each stack first in every other
            # one, as the in-process reservations: in turns of 6 s the same code measured the hot
            # paths grown / empty at 1.15-1.56 in one run and 0.73-0.91 in the next.
            for path in paths["grown"]:
                for turn in range(TURNS):
                    for name in (("grown", "empty") if (rnd + turn) % 2 == 0 else ("empty", "grown")):
                        lsn = await wal_lsn(admin)
                        run = await closed_loop(paths[name][path], concurrency=IN_FLIGHT, duration=SECONDS / 2)
                        runs.setdefault(f"{path}, {name}", []).append(run)
                        if "purchase" in path:
                            wal.setdefault(f"{path}, {name}", []).append(
                                (int(await admin.fetchval("SELECT $1::pg_lsn - $2::pg_lsn", await wal_lsn(admin),
                                                          lsn)), run.ops))
            for name in (("grown", "empty") if rnd % 2 == 0 else ("empty", "grown")):
                side = sides[name]
                for path, op in merchant_reads(side, sites[name], stubs[name]).items():
                    runs.setdefault(f"{path}, {name}", []).append(
                        await closed_loop(op, concurrency=1, duration=SECONDS / 3))
        stats = merge_statements([dict(r) for r in await admin.fetch(
            STATEMENT_STATS, [db.rsplit("/", 1)[1] for d in (grown_dsns, empty_dsns) for db in d.values()])]
                                 ) if statements else []
        for c in ch.values():
            await c.close()
        return runs, wal, sites, stats
    finally:
        await admin.close()
        for s in sides.values():
            await s.stop()


async def explain_rolled_back(conn: asyncpg.Connection, title: str, sql: str, *args) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of a statement, in a transaction rolled back (purges delete)."""
    tr = conn.transaction()
    await tr.start()
    try:
        return await explain(conn, title, sql, *args)
    finally:
        await tr.rollback()


async def as_service(admin_dsn: str, service: str, dsn: str, merchant: str) -> asyncpg.Connection:
    """A connection as the service's own role (Row-Level Security applies, as in production), working
    for `merchant` ('*': the service's own periodic work, across merchants)."""
    from cutylib.testing.postgres import service_dsn

    conn = await asyncpg.connect(await service_dsn(admin_dsn, service, dsn))
    await conn.execute("SELECT set_config('cuty.merchant', $1, false)", merchant)
    return conn


async def platform_plans(admin_dsn: str, name: str, dsns: dict[str, str], site: Site) -> list[str]:
    """The reads' and the periodic statements' plans on one platform's databases, as the services run
    them (their roles; the reads for merchant-test, the periodic work for every merchant)."""
    from booking.repository import LIST_BOOKINGS, SWEEP_EXPIRED
    from payments.bootstrap import payments_retention
    from payments.checkout.repository import CLAIM_DUE, ListQuery, list_statement
    from payments.checkout.metrics import NON_TERMINAL, SAGAS_BY_STATE
    from payments.metrics import NON_TERMINAL_PAYMENTS
    from payments.outbound.repository import CLAIM_MERCHANTS, GAUGES, REARM_BATCH, REARM_LOCK
    from payments.repository import TIMELINE

    plans = []
    m = "merchant-test"
    conn = await as_service(admin_dsn, "payments", dsns["payments"], m)
    try:
        checkout = await conn.fetchval("SELECT checkout_id FROM payments WHERE id = $1", uuid.UUID(site.payment))
        for title, q in (("no filter", ListQuery(merchant_id=m)),
                         ("salon", ListQuery(merchant_id=m, salon_id=uuid.UUID(site.salon))),
                         ("product", ListQuery(merchant_id=m, product_id=uuid.UUID(site.checkout_product))),
                         ("state EXPIRED", ListQuery(merchant_id=m, state="EXPIRED")),
                         ("created in a month", ListQuery(
                             merchant_id=m, created_after=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=200),
                             created_before=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=170)))):
            sql, args = list_statement(q, None, PAGE + 1)
            plans.append(await explain(conn, f"[{name}] ListCheckouts, {title}", sql, *args))
        plans.append(await explain(conn, f"[{name}] timeline page", TIMELINE, uuid.UUID(site.payment), checkout, 0,
                                   101, m))
        await conn.execute("SELECT set_config('cuty.merchant', '*', false)")
        plans.append(await explain_rolled_back(conn, f"[{name}] saga workers' claim", CLAIM_DUE, "bench", 50, 30.0))
        plans.append(await explain(conn, f"[{name}] payments gauge", NON_TERMINAL_PAYMENTS, 60.0))
        plans.append(await explain(conn, f"[{name}] sagas gauge", SAGAS_BY_STATE, list(NON_TERMINAL)))
        plans.append(await explain(conn, f"[{name}] outbound gauges", GAUGES))
        # Every delivery worker of every replica, every poll: the merchants with something due, not
        # the shops that subscribe (the grown database has a thousand shops' endpoints).
        plans.append(await explain_rolled_back(conn, f"[{name}] delivery workers' claim", CLAIM_MERCHANTS, 20, 4, 8, 5))
        plans.append(await explain_rolled_back(conn, f"[{name}] delivery workers' claim, the marks to re-arm",
                                               REARM_LOCK, REARM_BATCH))
        # The key tables leave by partition (cutylib.retention): the oldest one (here the legacy
        # partition holding every grown row) detached and dropped, rolled back; and the statements
        # that keep a key unique across the partitions, on the hot path.
        for table in ("checkout_idempotency_keys", "psp_events"):
            plans.append(await explain_rolled_back(
                conn, f"[{name}] retention, {table}: its oldest partition leaves (detach + drop)",
                "SELECT cuty_partition_drop($1, p) FROM cuty_partitions_detach($1, "
                "(SELECT min(upper) FROM cuty_partition_bounds($1)), $2) p", table, retention.LOCK_TIMEOUT_MS))
            plans.append(await explain_rolled_back(
                conn, f"[{name}] retention, {table}: partitions ahead", "SELECT cuty_partitions_ahead($1, $2, $3)",
                table, *next((t.width_days, t.ahead) for t in payments_retention(None).tables if t.name == table)))
        plans.append(await explain_rolled_back(
            conn, f"[{name}] hot path: an Idempotency-Key's first use (checkout_key_begin, across partitions)",
            "SELECT * FROM checkout_key_begin('cust-7', 'create', $1, '\\x00', gen_random_uuid(), 30, 86400)",
            uuid.uuid4().hex))
        plans.append(await explain_rolled_back(
            conn, f"[{name}] hot path: a PSP event stored once (psp_events_store, across partitions)",
            "SELECT psp_events_store($1, 'payment_intent.succeeded', NULL, '{}', 'processed', 5)",
            "evt_" + uuid.uuid4().hex))
        plans.append(await explain_rolled_back(
            conn, f"[{name}] outbound mover, a batch (nothing finished 30 days ago left)",
            "SELECT merchant_events_move($1, clock_timestamp() - interval '30 days')", MOVE_BATCH))
    finally:
        await conn.close()
    conn = await as_service(admin_dsn, "booking", dsns["booking"], m)
    try:
        plans.append(await explain(conn, f"[{name}] a salon's day", LIST_BOOKINGS, uuid.UUID(site.salon),
                                   dt.date.fromisoformat(site.day), False, None, None, None, PAGE + 1, m))
        await conn.execute("SELECT set_config('cuty.merchant', '*', false)")
        plans.append(await explain_rolled_back(conn, f"[{name}] hold sweeper", SWEEP_EXPIRED, 500))
        plans.append(await explain_rolled_back(
            conn, f"[{name}] holds mover, a batch (nothing older than a week left)",
            "SELECT holds_move($1, clock_timestamp() - interval '7 days')", MOVE_BATCH))
    finally:
        await conn.close()
    conn = await as_service(admin_dsn, "codepool", dsns["codepool"], m)
    try:
        plans.append(await explain(conn, f"[{name}] GetStock", catalog.STOCK, uuid.UUID(site.product), m))
        await conn.execute("SELECT set_config('cuty.merchant', '*', false)")
        plans.append(await explain(conn, f"[{name}] stock gauge", metrics.STOCK_BY_PRODUCT, 50))
        plans.append(await explain(conn, f"[{name}] stock events feed, the relay's poll", stock_events.LIST_AFTER,
                                   await conn.fetchval("SELECT coalesce(max(seq), 0) FROM stock_events"), 100))
        plans.append(await explain_rolled_back(conn, f"[{name}] stock round", "SELECT * FROM codepool_stock_round($1)",
                                               ROUND_PRODUCTS))
        plans.append(await explain_rolled_back(conn, f"[{name}] reservation sweeper", repository.CLAIM_EXPIRED,
                                               SWEEP_BATCH))
        # The batch's two picks on their own first (the function's EXPLAIN shows only its total):
        # which of them reads what, when nothing is left to move.
        # (The cutoff is a value, as the function's parameter is: clock_timestamp() would not bound the index.)
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=90)
        for status, at in (("delivered", "delivered_at"), ("released", "released_at")):
            plans.append(await explain_rolled_back(
                conn, f"[{name}] orders mover's pick of {status} orders (nothing finished 90 days ago left)",
                f"SELECT r.ctid, r.merchant_id, r.order_id FROM reservations r WHERE r.status = '{status}' "
                f"AND r.{at} < $2 ORDER BY r.{at} LIMIT $1 FOR UPDATE OF r SKIP LOCKED", ORDERS_MOVE_BATCH, cutoff))
        plans.append(await explain_rolled_back(
            conn, f"[{name}] orders mover, a batch (nothing finished 90 days ago left)",
            "SELECT reservations_move($1, clock_timestamp() - interval '90 days')", ORDERS_MOVE_BATCH))
        plans.append(await explain_rolled_back(
            conn, f"[{name}] orders mover, a batch of the orders finished since (rolled back)",
            "SELECT reservations_move($1, clock_timestamp())", ORDERS_MOVE_BATCH))
    finally:
        await conn.close()
    return plans


def statement_key(query: str) -> str:
    """A statement's text with its constants and parameters as `?`: pg_stat_statements keeps one
    statement under two entries when a cached plan first ran it after a reset (the text then keeps its
    literals: `state = 'done'` beside `state = $7`), and the two stacks may differ that way. Comments
    go first: an apostrophe in one ("the database's clock") would pair with a literal's quote in
    the entry that kept its literals, and not in the other."""
    query = re.sub(r"--[^\n]*", "", query)
    text = re.sub(r"\$\d+|'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b|\b(?:true|false|null)\b", "?",
                  " ".join(query.split()), flags=re.IGNORECASE)
    # extract(epoch FROM ...): the field is a constant too (`$2` in the other entry); so is a
    # negative number's sign (`-1` beside `$3`)
    text = re.sub(r"([(,=\s])-\?", r"\1?", text)
    return re.sub(r"\bextract\(\w+ FROM", "extract(? FROM", text, flags=re.IGNORECASE)


def merge_statements(stats) -> list[dict]:
    """One row per database and statement (statement_key): calls summed, mean weighted, max the max."""
    by: dict[tuple[str, str], dict] = {}
    for r in stats:
        k = (r["db"], statement_key(r["query"]))
        m = by.get(k)
        if m is None:
            by[k] = dict(r)
            continue
        calls = m["calls"] + r["calls"]
        m["mean_exec_time"] = (m["mean_exec_time"] * m["calls"] + r["mean_exec_time"] * r["calls"]) / calls
        m["total_exec_time"] = m["total_exec_time"] + r["total_exec_time"]
        m["max_exec_time"] = max(m["max_exec_time"], r["max_exec_time"])
        m["rows"] = m["rows"] + r["rows"]
        m["pages"] = m["pages"] + r["pages"]
        m["calls"] = calls
        if "$" in r["query"] and "$" not in m["query"]:
            m["query"] = r["query"]
    return list(by.values())


def pages_per_call(r) -> float:
    """Shared buffers a call of the statement touched (hit or read), nested statements included."""
    return round(r["pages"] / max(1, r["calls"]), 1)


def pages_per_row(r) -> float:
    """Shared buffers per row the statement answered or changed (at least one per call): a page of a
    list answers fifty rows on the grown databases and none on the empty ones, at the same cost a row."""
    return round(r["pages"] / max(1, r["calls"], r["rows"]), 1)


def paired(stats) -> dict[tuple[str, str], dict]:
    """The two stacks' statements side by side: {(service, statement_key): {"grown": row, "empty":
    row}}, a side missing when that stack did not run the statement."""
    by: dict[tuple[str, str], dict] = {}
    for r in stats:
        service = next(s for s in SERVICES if f"_{s}_" in r["db"])
        side = "grown" if "_grown_" in r["db"] else "empty"
        by.setdefault((service, statement_key(r["query"])), {})[side] = r
    return by


def judged(sides: dict) -> list[dict]:
    """Each statement the grown stack ran, with the empty stack's figures beside it (`other_stack`,
    None when the empty stack did not run it), as `targets` judges them."""
    out = []
    for pair in sides.values():
        r, o = pair.get("grown"), pair.get("empty")
        if r is None:
            continue
        out.append({"db": r["db"], "calls": r["calls"], "max_ms": round(r["max_exec_time"]),
                    "mean_ms": round(r["mean_exec_time"], 1), "pages_per_call": pages_per_call(r),
                    "pages_per_row": pages_per_row(r), "rows": r["rows"],
                    "other_stack": None if o is None else {
                        "calls": o["calls"], "mean_ms": round(o["mean_exec_time"], 1),
                        "max_ms": round(o["max_exec_time"]), "pages_per_call": pages_per_call(o),
                        "pages_per_row": pages_per_row(o)},
                    "query": " ".join(r["query"].split())[:160]})
    return out


def statement_table(by: dict[tuple[str, str], dict]) -> str:
    """Every statement the stacks ran (`paired`), grown beside empty (mean and max ms, pages a call),
    slowest on grown first."""
    rows = sorted(by.items(), key=lambda kv: -(kv[1].get("grown") or kv[1]["empty"])["max_exec_time"])
    out = ["service   | grown calls, mean / max ms, pages/call | empty calls, mean / max ms, pages/call | statement"]
    for (service, _), sides in rows:
        q = " ".join((sides.get("grown") or sides["empty"])["query"].split())
        cells = []
        for side in ("grown", "empty"):
            r = sides.get(side)
            cells.append(f"{r['calls']:>6}, {r['mean_exec_time']:8.2f} / {r['max_exec_time']:8.2f}, "
                         f"{pages_per_call(r):9.1f}" if r else " " * 39)
        out.append(f"{service:9} | {cells[0]} | {cells[1]} | {q[:400]}")
    return "\n".join(out) + "\n"


# The targets (docs/benchmarks.md, "Growth"): what each checks, read from this run's figures.
READ_P99_MS = 50.0
HOT_RATIO = 0.9
PERIODIC_MS = 100.0
HOT_PATHS = ("booking purchase", "code purchase", "HoldSlot", "ReserveCodes")
READS = ("GetStock", "ListCodes", "ListCheckouts", "a salon's day", "a payment's timeline")
PERIODIC = ("sweeper", "gauge", "recheck", "stock round", "purge", "claim", "mover", "_move")
PERIODIC_PLANS = ("saga workers' claim", "delivery workers' claim", "relay's poll", "gauge", "stock round", "purge",
                  "sweeper", "mover", "retention")


def plan_figures(plans: list[str]) -> dict[str, tuple[float, int, int]]:
    """{title: (execution ms, shared buffers of the top node, its rows)} of the kept plans."""
    out = {}
    for text in plans:
        title = text.splitlines()[0].removeprefix("-- ")
        ms = re.search(r"Execution Time: ([0-9.]+) ms", text)
        buf = re.search(r"Buffers: shared((?: \w+=\d+)+)", text)
        pages = sum(int(v) for v in re.findall(r"=(\d+)", buf.group(1))) if buf else 0
        rows = re.search(r"\(actual time=[0-9.]+\.\.[0-9.]+ rows=(\d+)", text)
        out[title] = (float(ms.group(1)) if ms else 0.0, pages, int(rows.group(1)) if rows else 0)
    return out


def flat(grown: float, empty: float) -> bool:
    """Cost that does not grow with a table: the grown side touches at most 4 x the empty side's
    pages, plus 50 (an index a level or two deeper, a few more heap pages)."""
    return grown <= 4 * empty + 50


def targets(results, plans: list[str], stack_statements: list[dict]) -> list[tuple[bool, str]]:
    """(met, line) per target and figure: reads' p99, hot paths grown against empty, periodic work."""
    lines = []
    by = {r.scenario: r for r in results}
    for r in results:
        name, _, side = r.scenario.rpartition(", ")
        if side not in ("grown", "big") or not name:
            continue
        if name.startswith(READS) and "before" not in name:
            lines.append((r.p99_ms <= READ_P99_MS, f"read p99 <= {READ_P99_MS:.0f} ms: {name}: {r.p99_ms} ms"))
        elif name.startswith(HOT_PATHS) and r.ratio_to_limit is not None:
            lines.append((r.ratio_to_limit >= HOT_RATIO,
                          f"hot path grown/empty >= {HOT_RATIO}: {name}: {r.ratio_to_limit}"))
    for r in results:  # a run with errors (the bench's slots ran out...) makes its ratio meaningless
        if r.extra.get("errors"):
            lines.append((False, f"no errors: {r.scenario}: {r.extra['errors']} errors"))
    for r in results:
        if any(w in r.scenario for w in PERIODIC) and "before" not in r.scenario:
            lines.append((r.p99_ms <= PERIODIC_MS, f"periodic p99 <= {PERIODIC_MS:.0f} ms: {r.scenario}: {r.p99_ms} ms"))
    figures = plan_figures(plans)
    for title, (ms, pages, rows) in figures.items():
        if not title.startswith("[grown] ") or not any(w in title for w in PERIODIC_PLANS):
            continue
        lines.append((ms <= PERIODIC_MS, f"periodic statement <= {PERIODIC_MS:.0f} ms: {title[8:]}: {ms} ms"))
        empty = figures.get("[empty] " + title[8:])
        if empty is not None:
            # per row answered or changed (at least one), as the stacks' statements: a sweep that
            # found 153 due holds on one side and none on the other did work, not a scan
            grown_a_row, empty_a_row = pages / max(1, rows), empty[1] / max(1, empty[2])
            lines.append((flat(grown_a_row, empty_a_row),
                          f"periodic cost flat (pages a row grown <= 4 x empty + 50): {title[8:]}: "
                          f"{grown_a_row:.1f} ({pages} pages, {rows} rows) vs {empty_a_row:.1f} ({empty[1]}, {empty[2]})"))
    # The stacks' statements (pg_stat_statements): the target is the cost, "no periodic statement over
    # 100 ms, and none whose cost grows with a table". A statement's cost is its pages a row
    # (pages_per_row) and its mean; a single call's wall-clock maximum on this 2-core machine
    # running two stacks and the buyers is shown beside the empty stack's, not judged alone.
    compared = [st for st in stack_statements if st.get("other_stack")]
    for st in stack_statements:
        o = st.get("other_stack")
        what = (f"{st['query'][:120]}: grown max {st['max_ms']} ms, mean {st['mean_ms']} ms, "
                f"{st['pages_per_row']} pages a row ({st['pages_per_call']} a call) x{st['calls']}")
        if o is None:
            if st["max_ms"] > PERIODIC_MS:
                lines.append((False, f"statement with a call over {PERIODIC_MS:.0f} ms, not run on the empty stack: {what}"))
            continue
        what += (f"; empty max {o['max_ms']} ms, mean {o['mean_ms']} ms, {o['pages_per_row']} pages a row "
                 f"({o['pages_per_call']} a call) x{o['calls']}")
        if not flat(st["pages_per_row"], o["pages_per_row"]):
            lines.append((False, f"statement cost flat (pages a row grown <= 4 x empty + 50): {what}"))
        if st["max_ms"] > PERIODIC_MS:
            lines.append((st["mean_ms"] <= PERIODIC_MS,
                          f"statement with a call over {PERIODIC_MS:.0f} ms: mean <= {PERIODIC_MS:.0f} ms: {what}"))
    if compared:
        growing = sum(not flat(st["pages_per_row"], st["other_stack"]["pages_per_row"]) for st in compared)
        lines.append((growing == 0, f"statement cost flat (pages a row grown <= 4 x empty + 50): "
                                    f"{len(compared) - growing} of the {len(compared)} statements both stacks ran"))
    return lines


async def db_sizes(dsns: dict[str, str]) -> dict:
    out = {}
    for s, dsn in dsns.items():
        conn = await asyncpg.connect(dsn)
        try:
            out[s] = {"bytes": await conn.fetchval("SELECT pg_database_size(current_database())"),
                      "tables": {r["t"]: r["b"] for r in await conn.fetch(
                          "SELECT relname AS t, pg_total_relation_size(oid) AS b FROM pg_class "
                          "WHERE relkind IN ('r', 'p') AND relnamespace = 'public'::regnamespace "
                          "ORDER BY b DESC LIMIT 8")}}
        finally:
            await conn.close()
    return out


# The retention movers (cutylib.retention): service, move function, its age in days.
MOVE_BATCH = retention.MOVE_BATCH
MOVERS = (("booking", "holds_move", 7, MOVE_BATCH), ("payments", "merchant_events_move", 30, MOVE_BATCH),
          ("codepool", "reservations_move", 90, ORDERS_MOVE_BATCH))


async def drain_movers(dsns: dict[str, str]) -> dict[str, Run]:
    """The grown databases as a year of the retention job leaves them: every mover run in batches of
    the job's default size (each one transaction, timed) until it has nothing older than its age to move, as the
    job's first rounds on an upgraded platform would (the batch's figure is the periodic one)."""
    runs = {}
    for service, function, days, batch in MOVERS:
        conn = await asyncpg.connect(dsns[service])
        try:
            # The planner's statistics, as a platform that has run for a year has them (the fill wrote
            # with triggers off and analysed nothing; without them a batch's lookups by key scan).
            await conn.execute("SET statement_timeout = 0")
            await conn.execute("ANALYZE")
            lat, moved = [], 0
            t0 = time.perf_counter()
            while True:
                t = time.perf_counter()
                n = await conn.fetchval(f"SELECT {function}($1, clock_timestamp() - make_interval(days => $2))",
                                        batch, days)
                lat.append((time.perf_counter() - t) * 1000)
                moved += n
                if n < batch:
                    break
            run = Run(len(lat), time.perf_counter() - t0, lat)
            runs[f"{function} batch ({batch}), draining a year"] = run
            print(f"  {function}: moved {moved:,} rows in {run.seconds:.1f}s", flush=True)
        finally:
            await conn.close()
    return runs


async def vacuum(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET statement_timeout = 0")
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def main() -> None:
    server = bench_postgres()
    statements = await statements_on(server)
    work = tempfile.mkdtemp(prefix="cuty-bench-growth-")
    suffix = uuid.uuid4().hex[:6]
    grown = {s: with_database(server.dsn, f"cuty_{s}_grown_{suffix}") for s in SERVICES}
    empty = {s: with_database(server.dsn, f"cuty_{s}_empty_{suffix}") for s in SERVICES}
    for dsns in (grown, empty):
        for s, dsn in dsns.items():
            await migrate(dsn, ROOT / "services" / s / "migrations")
    big_product = uuid.uuid4()
    now = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
    year_ago, day_ago = now - dt.timedelta(days=365), now - dt.timedelta(days=1)
    print(f"filling at scale {SCALE} of a year: {growth_fill.sizes(SCALE)}", flush=True)
    filled, fill_seconds = {}, {}
    fill_start = time.perf_counter()

    async def timed_fill(s: str, fill) -> None:
        t0 = time.perf_counter()
        filled[s] = await fill
        fill_seconds[s] = round(time.perf_counter() - t0)

    # The three databases are filled at once, each by its own connection.
    await asyncio.gather(
        timed_fill("booking", growth_fill.fill_booking(grown["booking"], SCALE, year_ago)),
        timed_fill("codepool", growth_fill.fill_codepool(grown["codepool"], SCALE, big_product, year_ago)),
        timed_fill("payments", growth_fill.fill_payments(grown["payments"], SCALE, big_product, year_ago, day_ago)))
    fill_seconds["all, at once"] = round(time.perf_counter() - fill_start)
    big = Product("big", growth_fill.TEST_MERCHANT, filled["codepool"]["big_product_codes"], big_product)
    small = Product("small", "m-small", SMALL_CODES)
    conn = await asyncpg.connect(grown["codepool"])
    await fill_small(conn, small)
    drained = await drain_movers(grown)
    t0 = time.perf_counter()
    for dsn in (*grown.values(), *empty.values()):
        await vacuum(dsn)
    sizes = await db_sizes(grown)
    print(f"filled in {fill_seconds} s (+ vacuum {time.perf_counter() - t0:.0f} s): {filled}", flush=True)
    print({s: f"{v['bytes'] / 2**20:.0f} MB" for s, v in sizes.items()}, flush=True)

    runs: dict[str, list[Run]] = {name: [run] for name, run in drained.items()}
    plans: list[str] = []
    extra = {"scale": SCALE, "filled": filled, "fill_seconds": fill_seconds, "sizes": sizes}
    try:
        if "pool" in PARTS:
            pool_runs, pool_plans, extra["swept"] = await pool_part(grown["codepool"], conn, big, small)
            runs.update(pool_runs)
            plans += pool_plans
            # The pool part's churn (its 1,000-code batches: hundreds of thousands of dead code
            # rows) vacuumed before the stacks start, so that autovacuum's pass over `codes` does
            # not fall on the grown stack's measured rounds alone.
            await vacuum(grown["codepool"])
        if "stack" in PARTS:
            stack_runs, wal, sites, stats = await stack_part(server, work, grown, empty, big_product, statements)
            runs.update(stack_runs)
            extra["wal_bytes_per_purchase"] = {k: round(sum(b for b, _ in v) / max(1, sum(n for _, n in v)))
                                               for k, v in wal.items()}
            extra["sizes_after"] = {"grown": await db_sizes(grown), "empty": await db_sizes(empty)}
            for name, dsns in (("grown", grown), ("empty", empty)):
                try:
                    plans += await platform_plans(server.dsn, name, dsns, sites[name])
                except Exception as e:  # the figures measured so far still get their report
                    plans.append(f"-- [{name}] the plans stopped: {type(e).__name__}: {e}\n")
                    print(plans[-1], flush=True)
            if stats:
                sides = paired(stats)
                STATEMENTS.parent.mkdir(parents=True, exist_ok=True)
                STATEMENTS.write_text(f"-- bench/growth.py, scale {SCALE}: every statement the two stacks ran in "
                                      f"the measured rounds (pg_stat_statements)\n" + statement_table(sides))
                print(f"wrote {STATEMENTS}")
                extra["stack_statements"] = judged(sides)
        RESULTS.mkdir(parents=True, exist_ok=True)
        PLANS.write_text(f"-- bench/growth.py, scale {SCALE}: {filled}\n\n" + "\n".join(plans))
        print(f"wrote {PLANS}")
    finally:
        await conn.close()
        server.close()

    results = []
    for name, rs in runs.items():
        m = merged(rs)
        base = name.rsplit(", ", 1)
        limit = None
        for grown_name, other in (("big", "small"), ("grown", "empty")):
            if len(base) == 2 and base[1] == grown_name and f"{base[0]}, {other}" in runs:
                limit = merged(runs[f"{base[0]}, {other}"])  # the ratio: grown against empty
        conc = IN_FLIGHT if name.startswith(("ReserveCodes", "booking purchase", "code purchase", "HoldSlot")) else 1
        results.append(m.result(name, conc, limit=limit, notes=f"{len(rs)} rounds" if len(rs) > 1 else ""))
    extra["load_average"] = os.getloadavg()
    checked = targets(results, plans, extra.get("stack_statements", []))
    extra["targets"] = [f"{'PASS' if ok else 'FAIL'} {line}" for ok, line in checked]
    results[0].extra.update(extra)
    report("growth", results)
    print(f"\n== targets (load average {os.getloadavg()[0]:.1f}: shared machine figures are ratios within this run) ==")
    for line in extra["targets"]:
        print(line)
    print(f"{sum(ok for ok, _ in checked)} of {len(checked)} met")


if __name__ == "__main__":
    asyncio.run(main())
