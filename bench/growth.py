"""What a grown code pool costs (`make bench-growth`): every path on a product with millions of codes
next to one with 5,000, in the same database and the same run.

The code pool's database is filled in SQL (`INSERT ... SELECT generate_series`, minutes, not hours):
- the big product: BENCH_GROWTH_CODES codes (2,000,000; 10,000,000 for the issue's size), the oldest
  BENCH_GROWTH_SOLD of them (0.9) sold a year long: delivered, each with its reservation (quantity 1,
  a customer among 200,000) and its delivery;
- the small product: 5,000 codes of another merchant, none sold yet;
- BENCH_GROWTH_MERCHANTS (1,000) more merchants with one product of 100 codes each, so the periodic
  work sees a platform's number of products.

Then, alternating the two products (BENCH_ROUNDS rounds of BENCH_SECONDS each):
- ReserveCodes (the use case, ReservationService.reserve: quantity 1 and 10, 8 in flight), each
  reservation released at once (not timed: the small product's stock lasts the run), and one
  statement changing 1,000 codes (the stock counters' trigger: counted, and with it disabled);
- GetStock (Catalog.stock, a staff caller), and the count it replaced;
- a ListCodes page (Catalog.list_codes, first and middle page, values decrypted);
- the reservation sweeper (ReservationService.expire_due, batches of 500) on each product's due
  reservations, and an idle round;
- the periodic work over all products: the stock gauge's refresh (metrics.refresh_stock, and the
  count it replaced) and the `stock.low` recheck.

EXPLAIN (ANALYZE, BUFFERS) of each read is written to bench/results/growth-plans.txt; figures to
bench/results/growth.json.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import time
import uuid

import asyncpg
import prometheus_client

from _common import RESULTS, ROOT, Run, bench_postgres, closed_loop, merged, report

from cutylib.config import with_database
from cutylib.db import create_pool, migrate
from cutylib.principal import Principal
from codepool import catalog, metrics, repository
from codepool.domain import ReserveCommand
from codepool.keys import Keyring
from codepool.service import ReservationService
from codepool.stock_events import StockEvents

MIGRATIONS = ROOT / "services" / "codepool" / "migrations"
BIG_CODES = int(os.environ.get("BENCH_GROWTH_CODES", "2000000"))
SMALL_CODES = 5_000
SOLD = float(os.environ.get("BENCH_GROWTH_SOLD", "0.9"))
MERCHANTS = int(os.environ.get("BENCH_GROWTH_MERCHANTS", "1000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
CHUNK = 500_000
CUSTOMERS = 200_000
IN_FLIGHT = 8
PAGE = 50
PLANS = RESULTS / "growth-plans.txt"

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
COUNTED_GAUGE = """
SELECT p.id::text AS product_id, s.state, count(c.id) AS n
FROM products p
CROSS JOIN (VALUES ('available'), ('reserved'), ('delivered')) AS s(state)
LEFT JOIN codes c ON c.product_id = p.id AND c.status = s.state
GROUP BY p.id, s.state
"""

# Codes as the importer writes them, with stand-in bytes (only ListCodes' pages are decrypted, and
# those are re-encrypted below); ids derived from the tag and number, so deliveries can name them.
FILL_CODES = """
INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash, status,
                   reserved_at, delivered_at, created_at)
SELECT md5($4 || g)::uuid, $1, $2, $3, 'k', substr(decode(md5(g::text), 'hex'), 1, 12),
       decode(md5(g::text) || md5(g::text), 'hex'), decode(md5($4 || g) || md5(g::text), 'hex'),
       CASE WHEN g <= $7 THEN 'delivered' ELSE 'available' END,
       CASE WHEN g <= $7 THEN t.at END, CASE WHEN g <= $7 THEN t.at + interval '1 minute' END, t.at
FROM generate_series($5::bigint, $6::bigint) g,
     LATERAL (SELECT clock_timestamp() - interval '365 days' * (1 - g::float8 / $8) AS at) t
"""
FILL_RESERVATIONS = """
INSERT INTO reservations (merchant_id, order_id, order_item_id, product_id, customer_id, quantity, unit_price_minor,
                          currency, status, reserved_at, expires_at, delivered_at, payment_transaction_id)
SELECT $1, $3 || '-' || g, $3 || '-' || g || '/1', $2, 'cust-' || (g % $6), 1, 500, 'TRY', 'delivered',
       c.reserved_at, c.reserved_at + interval '15 minutes', c.delivered_at, 'tx-' || $3 || '-' || g
FROM generate_series($4::bigint, $5::bigint) g JOIN codes c ON c.id = md5($3 || g)::uuid
"""
FILL_DELIVERIES = """
INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status, reserved_at,
                        delivered_at)
SELECT $1, $3 || '-' || g, $3 || '-' || g || '/1', $2, 'cust-' || (g % $6), md5($3 || g)::uuid, 'delivered',
       clock_timestamp(), clock_timestamp()
FROM generate_series($4::bigint, $5::bigint) g
"""


class Product:
    def __init__(self, name: str, merchant: str, codes: int, sold: float):
        self.name, self.merchant, self.codes, self.sold = name, merchant, codes, sold
        self.id = uuid.uuid4()
        self.tag = name[:1] + uuid.uuid4().hex[:6]
        self.staff = Principal("staff-" + merchant, "staff", merchant)
        self.middle: uuid.UUID | None = None  # a ListCodes cursor half-way through the product's codes


async def fill(conn: asyncpg.Connection, p: Product) -> float:
    t0 = time.perf_counter()
    batch = uuid.uuid4()
    await conn.execute("INSERT INTO products (id, merchant_id, sku, name, price_minor, currency, low_stock_threshold) "
                       "VALUES ($1, $2, $3, $3, 500, 'TRY', 10)", p.id, p.merchant, p.name)
    await conn.execute("INSERT INTO supplier_batches (id, merchant_id, product_id, batch_ref, received, imported, "
                       "content_digest, actor) VALUES ($1, $2, $3, 'year', $4, $4, $5, 'bench')",
                       batch, p.merchant, p.id, p.codes, os.urandom(32))
    sold = int(p.codes * p.sold)
    for lo in range(1, p.codes + 1, CHUNK):
        hi = min(p.codes, lo + CHUNK - 1)
        await conn.execute(FILL_CODES, p.merchant, p.id, batch, p.tag, lo, hi, sold, p.codes)
        if lo <= sold:
            args = (p.merchant, p.id, p.tag, lo, min(hi, sold), CUSTOMERS)
            await conn.execute(FILL_RESERVATIONS, *args)
            await conn.execute(FILL_DELIVERIES, *args)
        print(f"  {p.name}: {hi:,} of {p.codes:,} codes ({time.perf_counter() - t0:.0f}s)", flush=True)
    return time.perf_counter() - t0


async def fill_merchants(conn: asyncpg.Connection, n: int) -> None:
    """n merchants with one product of 100 available codes each (in three statements)."""
    await conn.execute("""
        INSERT INTO products (id, merchant_id, sku, name, price_minor, currency)
        SELECT md5('p' || m)::uuid, 'shop-' || m, 'sku', 'Card', 100, 'TRY' FROM generate_series(1, $1) m""", n)
    await conn.execute("""
        INSERT INTO supplier_batches (id, merchant_id, product_id, batch_ref, received, imported, content_digest, actor)
        SELECT md5('b' || m)::uuid, 'shop-' || m, md5('p' || m)::uuid, 'b', 100, 100, sha256(m::text::bytea), 'bench'
        FROM generate_series(1, $1) m""", n)
    await conn.execute("""
        INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash)
        SELECT gen_random_uuid(), 'shop-' || m, md5('p' || m)::uuid, md5('b' || m)::uuid, 'k',
               substr(sha256(g::text::bytea), 1, 12), sha256((m * 1000 + g)::text::bytea),
               sha256(('shop' || m || '-' || g)::bytea)
        FROM generate_series(1, $1) m, generate_series(1, 100) g""", n)
    await conn.execute("UPDATE products SET stock_low = false WHERE merchant_id LIKE 'shop-%'")


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


async def main() -> None:
    server = bench_postgres()
    dsn = with_database(server.dsn, f"cuty_growth_{uuid.uuid4().hex[:8]}")
    await migrate(dsn, pathlib.Path(MIGRATIONS))
    admin = await asyncpg.connect(server.dsn)
    await admin.execute("ALTER SYSTEM SET autovacuum_naptime = '5s'")
    await admin.execute("SELECT pg_reload_conf()")
    await admin.close()
    keyring = Keyring(keys={"b1": os.urandom(32)}, active="b1", hash_key=os.urandom(32))
    big = Product("big", "m-big", BIG_CODES, SOLD)
    small = Product("small", "m-small", SMALL_CODES, 0.0)
    conn = await asyncpg.connect(dsn)
    print(f"filling: {BIG_CODES:,} + {SMALL_CODES:,} codes, {SOLD:.0%} sold, {MERCHANTS:,} more merchants", flush=True)
    fill_seconds = {p.name: await fill(conn, p) for p in (big, small)}
    await fill_merchants(conn, MERCHANTS)
    for p in (big, small):
        await encrypt_pages(conn, keyring, p)
    t0 = time.perf_counter()
    await conn.execute("VACUUM ANALYZE")
    sizes = dict(await conn.fetchrow(
        "SELECT pg_size_pretty(pg_database_size(current_database())) AS database, "
        "pg_size_pretty(pg_total_relation_size('codes')) AS codes, "
        "pg_size_pretty(pg_total_relation_size('reservations')) AS reservations, "
        "pg_size_pretty(pg_total_relation_size('deliveries')) AS deliveries, "
        "(SELECT count(*) FROM product_stock) AS counter_rows"))
    print(f"filled in {sum(fill_seconds.values()):.0f}s (+ vacuum {time.perf_counter() - t0:.0f}s): {sizes}", flush=True)

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

    async def reserve_round(p: Product, quantity: int) -> Run:
        """Reservations, each released at once; the latencies are the reservations' alone."""
        latencies: list[float] = []

        async def cycle(i: int) -> None:
            t0 = time.perf_counter()
            order = await reserve(p, quantity)
            latencies.append((time.perf_counter() - t0) * 1000)
            await service.release(order, "bench")

        run = await closed_loop(cycle, concurrency=IN_FLIGHT, duration=SECONDS)
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
        for _ in range(ROUNDS):
            for p in (big, small):
                add(f"ReserveCodes qty 1 (+ release), {p.name}", await reserve_round(p, 1))
                add(f"ReserveCodes qty 10 (+ release), {p.name}", await reserve_round(p, 10))
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
            add("stock gauge refresh (all products)", await timed(lambda: gauge.refresh_stock(pool), 20))
            add("stock gauge by count (before)", await timed(lambda: pool.fetch(COUNTED_GAUGE), 3))
            add("stock.low recheck (all products)", await timed(lambda: StockEvents(pool).recheck(), 20))
            add("sweeper idle round", await timed(lambda: service.expire_due(500), 50))
        # The sweeper on 2,000 reservations of each product, made due.
        sweeps = {}
        for p in (big, small):
            await closed_loop(lambda i, p=p: reserve(p, 1), concurrency=IN_FLIGHT, total=2000)
            n = await conn.fetchval("WITH u AS (UPDATE reservations SET expires_at = clock_timestamp() - interval '1 s' "
                                    "WHERE merchant_id = $1 AND status = 'reserved' RETURNING 1) SELECT count(*) FROM u",
                                    p.merchant)
            t0 = time.perf_counter()
            run = await closed_loop(lambda i: service.expire_due(500), concurrency=1, total=-(-n // 500))
            sweeps[p.name] = n
            add(f"sweeper batch of 500, {p.name}", run)
            print(f"  swept {n:,} {p.name} reservations in {time.perf_counter() - t0:.2f}s", flush=True)

        plans = [await explain(conn, f"GetStock, {p.name}", catalog.STOCK, p.id, p.merchant) for p in (big, small)]
        plans += [await explain(conn, f"GetStock by count (before), {p.name}", COUNTED_STOCK, p.id, p.merchant)
                  for p in (big, small)]
        plans += [await explain(conn, f"ListCodes middle page, {p.name}", catalog.LIST_CODES, p.merchant, p.id,
                                p.middle, PAGE) for p in (big, small)]
        plans.append(await explain(conn, "stock gauge", metrics.STOCK_BY_PRODUCT, 50))
        plans.append(await explain(conn, "stock gauge by count (before)", COUNTED_GAUGE))
        plans.append(await explain(conn, "OutOfStock's count, big", repository.COUNT_AVAILABLE, big.id))
        plans.append(await explain(conn, "sweeper claim (idle)", repository.CLAIM_EXPIRED, 500))
        plans.append(await explain(
            conn, "per-customer cap count, a customer with history on the big product",
            "SELECT count(*), coalesce(sum(r.quantity) FILTER (WHERE r.product_id = $2), 0) FROM reservations r "
            "WHERE r.customer_id = $1 AND r.status = 'reserved' AND r.expires_at > clock_timestamp()", "cust-7", big.id))
        plans.append(await explain(
            conn, "reserve's pick, big", "SELECT id FROM codes WHERE merchant_id = $1 AND product_id = $2 AND "
            "status = 'available' ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED", big.merchant, big.id))
        RESULTS.mkdir(parents=True, exist_ok=True)
        PLANS.write_text(f"-- bench/growth.py: {BIG_CODES:,} + {SMALL_CODES:,} codes, {MERCHANTS:,} more merchants\n\n"
                         + "\n".join(plans))
        print(f"wrote {PLANS}")
    finally:
        await pool.close()
        await conn.close()
        server.close()

    results = []
    for name, rs in runs.items():
        m = merged(rs)
        base = name.rsplit(", ", 1)
        limit = None
        if len(base) == 2 and base[1] == "big" and f"{base[0]}, small" in runs:
            limit = merged(runs[f"{base[0]}, small"])  # the ratio: big against small
        results.append(m.result(name, IN_FLIGHT if name.startswith("ReserveCodes") else 1, limit=limit,
                                notes=f"{len(rs)} rounds" if len(rs) > 1 else ""))
    results[0].extra.update({"fill_seconds": {k: round(v) for k, v in fill_seconds.items()}, "sizes": sizes,
                             "swept": sweeps, "big_codes": BIG_CODES, "small_codes": SMALL_CODES,
                             "merchants": MERCHANTS, "load_average": os.getloadavg()})
    report("growth", results)


if __name__ == "__main__":
    asyncio.run(main())
