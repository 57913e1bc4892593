"""A year of a busy platform, generated in SQL (`INSERT ... SELECT generate_series`) for
`make bench-growth` (bench/growth.py): booking, the code pool and payments filled as one platform.

At scale 1.0 (the sizes a year of sales gives):
- 1,001 merchants: `merchant-test` (the tests' merchant: the bench's staff and admin users read its
  data) with 500 chairs, and `shop-1` .. `shop-1000` with 5 chairs each, one salon each;
- 5,000,000 holds (each on its own slot: 90 % confirmed, 5 % expired, 5 % released), spread over
  the year before now; one chair's holds never overlap (the exclusion constraint holds). Those
  that finished over 30 days ago are in `holds_history`, moved a week after they finished, as the
  retention job leaves them; the rest are live (the bench's timed mover batches move the ones that
  finished 7-30 days ago);
- 5,000,000 checkouts (half bookings of those holds, half code purchases; 90 % COMPLETED, 6 %
  EXPIRED, 3 % FAILED, 1 % REFUNDED), each with its payment and 4 payment events (20,000,000),
  a merchant event for every fifth COMPLETED one (900,000) and its webhook delivery (those over 45
  days old in their histories, moved 30 days after as the retention job leaves them; the mover's
  timed batches move the rest of the older ones);
- 10,000,000 codes: 5,000,000 of one product of `merchant-test` (90 % sold: delivered, each with
  its reservation, delivery and audit entry), and 5,000 for each shop's product;
- the idempotency keys of the last 3 days (their retention: older day partitions have left) and
  the PSP's webhook events of the last 37 days (two per payment; older weeks have left).
One merchant (`merchant-test`) has about a tenth of the sales and half the codes; the other 1,000
share the rest evenly.

How it is fast (scale 0.1 in under 2 minutes on a shared 2-core machine, against 12 before):
- the three databases are filled at once, one connection each;
- rows are written with session_replication_role = replica: no row triggers and no foreign-key
  triggers while writing (the per-row triggers would turn minutes into hours). The triggers that
  would have written rows of their own are replaced by what they would have written: the stock
  counters are counted from the codes once (RECOUNT), the stock summary rows written as their
  migration writes them;
- the filled tables' indexes, primary keys, unique and exclusion constraints and the foreign keys
  from or to them are dropped first and built after (`drop_indexes`, `build_indexes`): sorted
  index builds instead of a random insertion per row, and PostgreSQL checks every row as each
  constraint comes back (every foreign key too), so the rows are valid under all of them. CHECK
  constraints apply as each row is written;
- the salons' zone CHECK looks each row's zone up in pg_timezone_names (tens of ms a row): the one
  zone is looked up once and the check answers it from that while the salons are written (`salons`).
"""
from __future__ import annotations

import datetime as dt
import os
import pathlib
import time
import uuid

import asyncpg

ROOT = pathlib.Path(__file__).resolve().parent.parent

CHUNK = 250_000
CHAIRS = 5_500  # chairs 0-499: merchant-test; 500 + 5 (m - 1) .. + 4: shop-m
SHOPS = 1_000
CUSTOMERS = 200_000
TEST_MERCHANT = "merchant-test"
# The merchant of chair (resource number) r, and of checkout / hold number g (chair g % CHAIRS).
MERCH = "(CASE WHEN {r} < 500 THEN 'merchant-test' ELSE 'shop-' || (({r} - 500) / 5 + 1) END)"


def sizes(scale: float) -> dict[str, int]:
    return {
        "holds": max(CHAIRS, int(5_000_000 * scale)),
        "checkouts": max(CHAIRS, int(5_000_000 * scale)),
        "big_codes": max(10_000, int(5_000_000 * scale)),
        "shop_codes": max(100, int(5_000 * scale)),
    }


async def replica(conn: asyncpg.Connection) -> None:
    await conn.execute("SET session_replication_role = replica")
    await conn.execute("SET statement_timeout = 0")  # the databases' 60 s is for the services' statements


# What the fill drops before it writes the tables and builds again after, from the definitions
# PostgreSQL gives (pg_get_indexdef, pg_get_constraintdef): the plain indexes, the primary keys, the
# unique and exclusion constraints of those tables, and the foreign keys from or to them. Each index
# is then one sorted build instead of a random insertion per row, and PostgreSQL itself checks every
# row again when the constraints come back (each foreign key by one anti-join, each unique or
# exclusion constraint as its index is built): a fill that broke one fails there. A partitioned
# table's are taken at the parent (dropped and built for every partition at once).
PLAIN_INDEXES = """
SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS def
FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
WHERE t.relnamespace = 'public'::regnamespace AND t.relname = ANY($1::text[])
  AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
  AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
ORDER BY 1
"""
CONSTRAINTS = """
SELECT k.conname, k.conrelid::regclass::text AS tbl, k.contype = 'f' AS fk, pg_get_constraintdef(k.oid) AS def
FROM pg_constraint k
WHERE k.connamespace = 'public'::regnamespace AND k.conparentid = 0 AND k.contype IN ('p', 'u', 'x', 'f')
  AND (k.conrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace
                                                 AND relname = ANY($1::text[]))
       OR (k.contype = 'f' AND k.confrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace
                                                                           AND relname = ANY($1::text[]))))
ORDER BY k.contype = 'f' DESC, 1
"""


async def drop_indexes(conn: asyncpg.Connection, tables: list[str]) -> list[str]:
    """Drops the indexes and constraints of `tables` (above); returns the statements that build them
    again, for `build_indexes`: the indexes and keys first, the foreign keys last."""
    later = []
    for r in await conn.fetch(PLAIN_INDEXES, tables):
        await conn.execute(f"DROP INDEX {r['name']}")
        # A partitioned table's index is defined `ON ONLY` the parent (its partitions' indexes
        # attached one by one); built without ONLY it builds every partition's at once.
        later.append(r["def"].replace(" ON ONLY ", " ON ", 1))
    constraints = await conn.fetch(CONSTRAINTS, tables)
    for r in constraints:  # the foreign keys first: a key they reference cannot go before them
        await conn.execute(f"ALTER TABLE {r['tbl']} DROP CONSTRAINT {r['conname']}")
    later += [f"ALTER TABLE {r['tbl']} ADD CONSTRAINT {r['conname']} {r['def']}"
              for r in sorted(constraints, key=lambda r: r["fk"])]
    return later


async def build_indexes(conn: asyncpg.Connection, what: str, statements: list[str]) -> None:
    t0 = time.perf_counter()
    await conn.execute("SET maintenance_work_mem = '256MB'")
    for d in statements:
        await conn.execute(d)
    invalid = await conn.fetch("SELECT indexrelid::regclass::text AS name FROM pg_index WHERE NOT indisvalid")
    if invalid:
        raise AssertionError(f"{what}: indexes left invalid: {[r['name'] for r in invalid]}")
    print(f"  {what}: {len(statements)} indexes and constraints built and checked "
          f"({time.perf_counter() - t0:.0f}s)", flush=True)


async def chunks(conn: asyncpg.Connection, what: str, total: int, sql: str, *args) -> None:
    t0 = time.perf_counter()
    for lo in range(1, total + 1, CHUNK):
        hi = min(total, lo + CHUNK - 1)
        await conn.execute(sql, lo, hi, *args)
        print(f"  {what}: {hi:,} of {total:,} ({time.perf_counter() - t0:.0f}s)", flush=True)


# --- booking --------------------------------------------------------------------------------------

MERCHANTS_SQL = f"""
SELECT 'merchant-test' AS m UNION ALL SELECT 'shop-' || g FROM generate_series(1, {SHOPS}) g
"""

FILL_SALONS = f"""
INSERT INTO salons (id, name, time_zone, merchant_id, created_at)
SELECT md5('salon-' || m)::uuid, 'Salon ' || m, 'Europe/Istanbul', m, $1::timestamptz FROM ({MERCHANTS_SQL}) x
"""
FILL_CHAIRS = f"""
INSERT INTO resources (id, salon_id, name, merchant_id, created_at)
SELECT md5('res' || r)::uuid, md5('salon-' || {MERCH.format(r='r')})::uuid, 'Chair ' || r, {MERCH.format(r='r')},
       $1::timestamptz
FROM generate_series(0, {CHAIRS - 1}) r
"""
# Hold g is on chair g % CHAIRS, the (g / CHAIRS)-th of that chair's holds, `step` hours after the
# previous one; $3 is a year ago (on the hour).
HOLD_TIMES = f"""
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT (g % {CHAIRS})::int AS r) a,
     LATERAL (SELECT {MERCH.format(r='a.r')} AS m,
                     $3::timestamptz + make_interval(hours => ((g / {CHAIRS}) * $4 + a.r % $4)::int) AS s) t
"""
FILL_SLOTS = f"""
INSERT INTO slots (id, salon_id, resource_id, start_time, end_time, price_minor, currency, created_at, merchant_id)
SELECT md5('slot' || g)::uuid, md5('salon-' || t.m)::uuid, md5('res' || a.r)::uuid, t.s, t.s + interval '1 hour',
       75000, 'TRY', t.s - interval '30 days', t.m
{HOLD_TIMES}
"""
# The columns of a hold, and when it finished (released and expired holds at their last change,
# confirmed ones at their end): what the retention job's mover goes by.
HOLD_ROW = f"""
SELECT md5('hold' || g)::uuid, md5('slot' || g)::uuid, md5('salon-' || t.m)::uuid, md5('res' || a.r)::uuid,
       'cust-' || (g % {CUSTOMERS}), 'req-' || g, st.status, t.s, t.s + interval '1 hour', 75000, 'TRY',
       t.s - interval '1 day' + interval '10 minutes', CASE WHEN st.status = 'confirmed' THEN 'pay-' || g END,
       t.s - interval '1 day', t.s - interval '1 day' + interval '1 minute', t.m{{extra}}
{HOLD_TIMES},
     LATERAL (SELECT CASE g % 20 WHEN 0 THEN 'expired' WHEN 1 THEN 'released' ELSE 'confirmed' END AS status) st,
     LATERAL (SELECT CASE WHEN st.status = 'confirmed' THEN t.s + interval '1 hour'
                          ELSE t.s - interval '1 day' + interval '1 minute' END AS finished) f
"""
HOLD_COLUMNS = """id, slot_id, salon_id, resource_id, customer_id, request_id, status, start_time, end_time,
                  price_minor, currency, expires_at, payment_ref, created_at, updated_at, merchant_id"""
# The holds that finished since $5 are live; the older ones are in the history, moved a week after
# they finished as the retention job's mover moves them (its own batches move what is between).
FILL_HOLDS = f"""
INSERT INTO holds ({HOLD_COLUMNS})
{HOLD_ROW.format(extra="")}
WHERE f.finished >= $5
"""
FILL_HOLDS_HISTORY = f"""
INSERT INTO holds_history ({HOLD_COLUMNS}, during, moved_at)
{HOLD_ROW.format(extra=", booking_blocked_range(t.s, t.s + interval '1 hour', 0, 0), f.finished + interval '7 days'")}
WHERE f.finished < $5
"""
# The holds of the last LIVE_HOLD_DAYS stay live: those of its first days are the mover's to move.
LIVE_HOLD_DAYS = 30


ZONE_CHECK = ROOT / "services" / "booking" / "migrations" / "functions" / "booking_is_iana_zone.sql"


async def salons(conn: asyncpg.Connection, year_ago) -> None:
    """The salons, all in one zone. Their CHECK looks the zone up in pg_timezone_names, which reads
    the whole zone database (tens of ms a row here): the zone is looked up once, and while the salons
    are written the check's function answers that one zone without the lookup (every other zone as
    before); the function's own file is applied again after."""
    assert await conn.fetchval("SELECT booking_is_iana_zone('Europe/Istanbul')")
    await conn.execute("CREATE OR REPLACE FUNCTION booking_is_iana_zone(tz text) RETURNS boolean LANGUAGE sql "
                       "STABLE AS $$ SELECT tz = 'Europe/Istanbul' OR (tz NOT IN ('localtime', 'posixrules', "
                       "'Factory') AND EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = tz)) $$")
    try:
        await conn.execute(FILL_SALONS, year_ago)
    finally:
        await conn.execute(ZONE_CHECK.read_text())


async def fill_booking(dsn: str, scale: float, year_ago) -> dict:
    n = sizes(scale)["holds"]
    step = max(1, 8760 * CHAIRS // n)  # hours between one chair's holds: the year, filled
    conn = await asyncpg.connect(dsn)
    try:
        await replica(conn)
        await salons(conn, year_ago)
        await conn.execute(FILL_CHAIRS, year_ago)
        later = await drop_indexes(conn, ["slots", "holds", "holds_history"])
        await chunks(conn, "slots", n, FILL_SLOTS, year_ago, step)
        live_since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=LIVE_HOLD_DAYS)
        await chunks(conn, "holds", n, FILL_HOLDS, year_ago, step, live_since)
        await chunks(conn, "holds' history", n, FILL_HOLDS_HISTORY, year_ago, step, live_since)
        await build_indexes(conn, "booking", later)
    finally:
        await conn.close()
    return {"holds": n, "slots": n, "hours_between_a_chairs_holds": step}


# --- code pool ------------------------------------------------------------------------------------

FILL_SHOP_PRODUCTS = f"""
INSERT INTO products (id, merchant_id, sku, name, price_minor, currency, created_at)
SELECT md5('p' || m)::uuid, 'shop-' || m, 'sku', 'Card', 100, 'TRY', $1::timestamptz FROM generate_series(1, {SHOPS}) m
"""
FILL_SHOP_BATCHES = f"""
INSERT INTO supplier_batches (id, merchant_id, product_id, batch_ref, received, imported, content_digest, actor)
SELECT md5('b' || m)::uuid, 'shop-' || m, md5('p' || m)::uuid, 'b', $1, $1, sha256(m::text::bytea), 'bench'
FROM generate_series(1, {SHOPS}) m
"""
# Shop codes: code number g belongs to shop (g - 1) % SHOPS + 1; all available.
FILL_SHOP_CODES = f"""
INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash, created_at)
SELECT md5('sc' || g)::uuid, 'shop-' || s.m, md5('p' || s.m)::uuid, md5('b' || s.m)::uuid, 'k',
       substr(decode(md5(g::text), 'hex'), 1, 12), decode(md5(g::text) || md5(g::text), 'hex'),
       decode(md5('sc' || g) || md5(g::text), 'hex'), $3::timestamptz
FROM generate_series($1::bigint, $2::bigint) g, LATERAL (SELECT (g - 1) % {SHOPS} + 1 AS m) s
"""
# The big product's codes, the oldest `sold` of them delivered over the year ($5: how many).
FILL_BIG_CODES = """
INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash, status,
                   reserved_at, delivered_at, created_at)
SELECT md5('bc' || g)::uuid, 'merchant-test', $3, $4, 'k', substr(decode(md5(g::text), 'hex'), 1, 12),
       decode(md5(g::text) || md5(g::text), 'hex'), decode(md5('bc' || g) || md5(g::text), 'hex'),
       CASE WHEN g <= $5 THEN 'delivered' ELSE 'available' END,
       CASE WHEN g <= $5 THEN t.at END, CASE WHEN g <= $5 THEN t.at + interval '1 minute' END, t.at
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT clock_timestamp() - interval '365 days' * (1 - g::float8 / $6) AS at) t
"""
FILL_RESERVATIONS = f"""
INSERT INTO reservations (merchant_id, order_id, order_item_id, product_id, customer_id, quantity, unit_price_minor,
                          currency, status, reserved_at, expires_at, delivered_at, payment_transaction_id)
SELECT 'merchant-test', 'big-' || g, 'big-' || g || '/1', $3, 'cust-' || (g % {CUSTOMERS}), 1, 2500, 'TRY',
       'delivered', c.reserved_at, c.reserved_at + interval '15 minutes', c.delivered_at, 'tx-big-' || g
FROM generate_series($1::bigint, $2::bigint) g JOIN codes c ON c.id = md5('bc' || g)::uuid
"""
FILL_DELIVERIES = f"""
INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status, reserved_at,
                        delivered_at)
SELECT 'merchant-test', 'big-' || g, 'big-' || g || '/1', $3, 'cust-' || (g % {CUSTOMERS}), md5('bc' || g)::uuid,
       'delivered', clock_timestamp(), clock_timestamp()
FROM generate_series($1::bigint, $2::bigint) g
"""
# Each delivered order's payment callback (DeliverCodes' transaction id), as the service records it.
FILL_PAYMENT_TRANSACTIONS = """
INSERT INTO payment_transactions (merchant_id, transaction_id, order_id, outcome, created_at)
SELECT 'merchant-test', 'tx-big-' || g, 'big-' || g, 'delivered', clock_timestamp()
FROM generate_series($1::bigint, $2::bigint) g
"""
FILL_AUDIT = f"""
INSERT INTO audit_log (at, actor, action, product_id, order_id, code_ids, merchant_id)
SELECT clock_timestamp() - interval '365 days' * (1 - g::float8 / $4), 'cust-' || (g % {CUSTOMERS}), 'deliver', $3,
       'big-' || g, ARRAY[md5('bc' || g)::uuid], 'merchant-test'
FROM generate_series($1::bigint, $2::bigint) g
"""
RECOUNT = """
INSERT INTO product_stock (merchant_id, product_id, slot, available, reserved, delivered)
SELECT merchant_id, product_id, codepool_stock_slot(id), count(*) FILTER (WHERE status = 'available'),
       count(*) FILTER (WHERE status = 'reserved'), count(*) FILTER (WHERE status = 'delivered')
FROM codes GROUP BY 1, 2, 3
ON CONFLICT (merchant_id, product_id, slot) DO UPDATE
SET available = EXCLUDED.available, reserved = EXCLUDED.reserved, delivered = EXCLUDED.delivered
"""


async def fill_codepool(dsn: str, scale: float, big_product: uuid.UUID, year_ago, sold: float = 0.9) -> dict:
    n = sizes(scale)
    big, per_shop = n["big_codes"], n["shop_codes"]
    delivered = int(big * sold)
    batch = uuid.uuid4()
    conn = await asyncpg.connect(dsn)
    try:
        await replica(conn)
        await conn.execute("INSERT INTO products (id, merchant_id, sku, name, price_minor, currency, "
                           "low_stock_threshold) VALUES ($1, 'merchant-test', 'big', 'Big card', 2500, 'TRY', 10)",
                           big_product)
        await conn.execute("INSERT INTO supplier_batches (id, merchant_id, product_id, batch_ref, received, imported, "
                           "content_digest, actor) VALUES ($1, 'merchant-test', $2, 'year', $3, $3, $4, 'bench')",
                           batch, big_product, big, os.urandom(32))
        await conn.execute(FILL_SHOP_PRODUCTS, year_ago)
        await conn.execute(FILL_SHOP_BATCHES, per_shop)
        later = await drop_indexes(conn, ["codes", "reservations", "deliveries", "audit_log"])
        await chunks(conn, "big product's codes", big, FILL_BIG_CODES, big_product, batch, delivered, big)
        await chunks(conn, "reservations", delivered, FILL_RESERVATIONS, big_product)
        await chunks(conn, "deliveries", delivered, FILL_DELIVERIES, big_product)
        await chunks(conn, "payment transactions", delivered, FILL_PAYMENT_TRANSACTIONS)
        await chunks(conn, "audit entries", delivered, FILL_AUDIT, big_product, delivered)
        await chunks(conn, "shops' codes", per_shop * SHOPS, FILL_SHOP_CODES, year_ago)
        await build_indexes(conn, "code pool", later)
        # Triggers were off: the counters are set from the codes once, as the counters' migration does.
        await conn.execute(RECOUNT)
        await conn.execute("UPDATE products SET stock_low = false")
        # Every product's summary row, as the stock summary's migration writes them (the stock rounds
        # then sum each product once: its counter rows are new, so marked changed).
        await conn.execute("INSERT INTO stock_summary (merchant_id, product_id) SELECT merchant_id, id FROM products "
                           "ON CONFLICT DO NOTHING")
    finally:
        await conn.close()
    return {"codes": big + per_shop * SHOPS, "big_product_codes": big, "delivered": delivered,
            "codes_per_shop": per_shop}


# --- payments -------------------------------------------------------------------------------------

# Checkout g: created at $3 + g / $4 of the year; even g a booking of hold g, odd g a code purchase
# (the big product for merchant-test, the shop's product otherwise).
CHECKOUT_OF = f"""
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT {MERCH.format(r=f'(g % {CHAIRS})')} AS m,
                     $3::timestamptz + interval '365 days' * (g::float8 / $4) AS t,
                     CASE WHEN g % 2 = 0 THEN 'booking' ELSE 'codes' END AS kind,
                     CASE WHEN g % 100 < 90 THEN 'COMPLETED' WHEN g % 100 < 96 THEN 'EXPIRED'
                          WHEN g % 100 < 99 THEN 'FAILED' ELSE 'REFUNDED' END AS state) x,
     LATERAL (SELECT CASE x.state WHEN 'COMPLETED' THEN 'succeeded' WHEN 'EXPIRED' THEN 'canceled'
                                  WHEN 'FAILED' THEN 'failed' ELSE 'refunded' END AS pay_status,
                     CASE WHEN x.kind = 'booking' THEN 75000 ELSE 2500 END AS amount,
                     CASE WHEN x.kind = 'codes' THEN
                         CASE WHEN x.m = 'merchant-test' THEN $5::uuid ELSE md5('p' || substr(x.m, 6))::uuid END
                     END AS product) y
"""
FILL_CHECKOUTS = f"""
INSERT INTO checkouts (id, customer_id, kind, state, outcome, slot_id, product_id, quantity, hold_id, order_id,
                       amount_minor, currency, expire_time, payment_key, payment_id, payment_method, created_at,
                       updated_at, merchant_id, salon_id, free_cancellation_hours, cancellation_fee_percent,
                       start_time)
SELECT md5('co' || g)::uuid, 'cust-' || (g % {CUSTOMERS}), x.kind, x.state,
       CASE x.state WHEN 'EXPIRED' THEN 'EXPIRED' WHEN 'FAILED' THEN 'FAILED' END,
       CASE WHEN x.kind = 'booking' THEN md5('slot' || g)::uuid END, y.product, 1,
       CASE WHEN x.kind = 'booking' THEN md5('hold' || g)::uuid::text END,
       CASE WHEN x.kind = 'codes' THEN md5('co' || g)::uuid END,
       y.amount, 'TRY', x.t + interval '10 minutes', md5('key' || g)::uuid, md5('pay' || g)::uuid, 'pm_card_ok',
       x.t, x.t + interval '2 seconds', x.m,
       CASE WHEN x.kind = 'booking' THEN md5('salon-' || x.m)::uuid END,
       CASE WHEN x.kind = 'booking' THEN 24 END, CASE WHEN x.kind = 'booking' THEN 0 END,
       CASE WHEN x.kind = 'booking' THEN x.t + interval '3 days' END
{CHECKOUT_OF}
"""
FILL_PAYMENTS = f"""
INSERT INTO payments (id, checkout_id, customer_id, status, version, psp_intent_id, amount_minor, currency,
                      payment_method, idempotency_key, failure_reason, created_at, updated_at, merchant_id,
                      refunded_minor, refund_settled_minor)
SELECT md5('pay' || g)::uuid, md5('co' || g)::uuid, 'cust-' || (g % {CUSTOMERS}), y.pay_status, 3, 'pi_' || g,
       y.amount, 'TRY', 'pm_card_ok', md5('key' || g)::uuid::text,
       CASE WHEN y.pay_status = 'failed' THEN 'card_declined' END, x.t, x.t + interval '2 seconds', x.m,
       CASE WHEN y.pay_status = 'refunded' THEN y.amount ELSE 0 END,
       CASE WHEN y.pay_status = 'refunded' THEN y.amount ELSE 0 END
{CHECKOUT_OF}
"""
# Four per checkout, in the order they happen: the hold, the charge, the PSP's answer, the end.
FILL_EVENTS = f"""
INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, note, created_at,
                            merchant_id)
SELECT CASE WHEN e IN (2, 3) THEN md5('pay' || g)::uuid END, md5('co' || g)::uuid,
       (ARRAY['saga', 'sync', 'webhook', 'saga'])[e], (ARRAY['PENDING', 'created', 'processing', 'CHARGING'])[e],
       (ARRAY['HELD', 'processing', y.pay_status, x.state])[e], CASE WHEN e IN (2, 3) THEN e END, '',
       x.t + make_interval(secs => e), x.m
{CHECKOUT_OF}, generate_series(1, 4) e
ORDER BY g, e
"""
# Merchant events and their deliveries made since $6 are live; older ones are in the histories,
# moved 30 days after (CUTY_MERCHANT_EVENTS_MOVE_AFTER_DAYS) as the retention job's mover moves
# them (its own batches move what is between). The histories' rows first, so the deliveries' seq
# (one identity, read by the delivery log across both tables) grows with time as it does live.
MERCHANT_EVENT = f"""
SELECT x.m, md5('ev' || g)::uuid, 'checkout.completed', md5('co' || g)::uuid,
       jsonb_build_object('checkoutId', md5('co' || g)::uuid, 'amountMinor', y.amount), x.t + interval '3 seconds'{{extra}}
{CHECKOUT_OF}
WHERE g % 5 = 0 AND x.state = 'COMPLETED'
"""
FILL_MERCHANT_EVENTS = f"""
INSERT INTO merchant_events (merchant_id, id, type, checkout_id, payload, created_at)
{MERCHANT_EVENT.format(extra="")} AND x.t >= $6
"""
FILL_MERCHANT_EVENTS_HISTORY = f"""
INSERT INTO merchant_events_history (merchant_id, id, type, checkout_id, payload, created_at, moved_at)
{MERCHANT_EVENT.format(extra=", x.t + interval '30 days 1 hour'")} AND x.t < $6
"""
# The shops subscribe (merchant-test does not: the bench's own purchases would be delivered nowhere).
FILL_ENDPOINTS = f"""
INSERT INTO webhook_endpoints (merchant_id, id, url, events, created_by, secret_key_id, secret_nonce,
                               secret_ciphertext)
SELECT 'shop-' || m, md5('ep' || m)::uuid, 'https://shop-' || m || '.example/hooks', ARRAY['checkout.completed'],
       'bench', 'k1', substr(sha256(m::text::bytea), 1, 12), sha256(m::text::bytea) || sha256(m::text::bytea)
FROM generate_series(1, {SHOPS}) m
"""
DELIVERY_OUT = f"""
SELECT x.m, md5('dl' || g)::uuid, md5('ep' || substr(x.m, 6))::uuid, md5('ev' || g)::uuid, 'delivered', 1,
       x.t + interval '3 days', x.t + interval '4 seconds', x.t + interval '3 seconds'{{extra}}
{CHECKOUT_OF}
WHERE g % 5 = 0 AND x.state = 'COMPLETED' AND x.m <> 'merchant-test'
"""
FILL_DELIVERIES_OUT = f"""
INSERT INTO webhook_deliveries (merchant_id, id, endpoint_id, event_id, state, attempts, give_up_at, delivered_at,
                                created_at)
{DELIVERY_OUT.format(extra="")} AND x.t >= $6
"""
FILL_DELIVERIES_OUT_HISTORY = f"""
INSERT INTO webhook_deliveries_history (merchant_id, id, endpoint_id, event_id, state, attempts, give_up_at,
                                        delivered_at, created_at, seq, moved_at)
{DELIVERY_OUT.format(extra=", nextval(pg_get_serial_sequence('webhook_deliveries', 'seq')), "
                           "x.t + interval '30 days 1 hour'")} AND x.t < $6
"""
# The outbound events of the last LIVE_EVENT_DAYS stay live: those of its first days are the mover's.
LIVE_EVENT_DAYS = 45
# The keys of the last days (older partitions have left): $3 the first day's start, $4 a day's count.
FILL_KEYS = f"""
INSERT INTO checkout_idempotency_keys (customer_id, operation, key, request_hash, resource_id, state, response,
                                       response_is_error, created_at, expires_at)
SELECT 'cust-' || (g % {CUSTOMERS}), 'create', 'k-' || g, sha256(g::text::bytea), md5('co' || g)::uuid, 'done',
       '\\x0a00'::bytea, false, t.at, t.at + interval '1 day'
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT $3::timestamptz + interval '1 day' * (g::float8 / $4) AS at) t
"""
# The PSP's events of the payments made since $1 (the retention's weeks), two each, handled.
FILL_PSP_EVENTS = """
INSERT INTO psp_events (event_id, type, payment_id, payload, status, attempts, received_at, processed_at)
SELECT 'evt_' || p.id || '_' || k, CASE k WHEN 1 THEN 'payment_intent.processing' ELSE 'payment_intent.succeeded' END,
       p.id, jsonb_build_object('id', 'evt_' || p.id || '_' || k), 'processed', 1,
       p.created_at + make_interval(secs => k), p.created_at + make_interval(secs => k)
FROM payments p, generate_series(1, 2) k
WHERE p.created_at >= $1
"""
KEY_DAYS = 3
PSP_EVENT_DAYS = 37


async def fill_payments(dsn: str, scale: float, big_product: uuid.UUID, year_ago, day_ago) -> dict:
    n = sizes(scale)["checkouts"]
    per_day = max(1, n // 365)
    keys = per_day * KEY_DAYS
    conn = await asyncpg.connect(dsn)
    try:
        await replica(conn)
        later = await drop_indexes(conn, ["checkouts", "payments", "payment_events", "merchant_events",
                                          "merchant_events_history", "webhook_deliveries",
                                          "webhook_deliveries_history", "checkout_idempotency_keys", "psp_events"])
        await chunks(conn, "checkouts", n, FILL_CHECKOUTS, year_ago, n, big_product)
        await chunks(conn, "payments", n, FILL_PAYMENTS, year_ago, n, big_product)
        await chunks(conn, "payment events (x4)", n, FILL_EVENTS, year_ago, n, big_product)
        live_since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=LIVE_EVENT_DAYS)
        await chunks(conn, "merchant events' history", n, FILL_MERCHANT_EVENTS_HISTORY, year_ago, n, big_product,
                     live_since)
        await chunks(conn, "merchant events", n, FILL_MERCHANT_EVENTS, year_ago, n, big_product, live_since)
        await conn.execute(FILL_ENDPOINTS)
        await chunks(conn, "webhook deliveries' history", n, FILL_DELIVERIES_OUT_HISTORY, year_ago, n, big_product,
                     live_since)
        await chunks(conn, "webhook deliveries", n, FILL_DELIVERIES_OUT, year_ago, n, big_product, live_since)
        await chunks(conn, f"idempotency keys ({KEY_DAYS} days)", keys, FILL_KEYS,
                     day_ago - dt.timedelta(days=KEY_DAYS - 1), per_day)
        await conn.execute(FILL_PSP_EVENTS, day_ago - dt.timedelta(days=PSP_EVENT_DAYS - 1))
        await build_indexes(conn, "payments", later)
        counts = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM payment_events) AS payment_events, "
            "(SELECT count(*) FROM merchant_events) + (SELECT count(*) FROM merchant_events_history) "
            "AS merchant_events, "
            "(SELECT count(*) FROM webhook_deliveries) + (SELECT count(*) FROM webhook_deliveries_history) "
            "AS webhook_deliveries, "
            "(SELECT count(*) FROM psp_events) AS psp_events")
    finally:
        await conn.close()
    return {"checkouts": n, "payments": n, **dict(counts), "idempotency_keys": keys}
