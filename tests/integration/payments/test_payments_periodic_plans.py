"""The statements that run every few seconds on every replica (the saga workers' claim, the gauges,
the delivery workers' claim) and the webhook's payment lookup read what they are about, not the
tables: on 20,000 finished checkouts with their payments, deliveries and events, and 2,000 merchants
with a webhook endpoint each, of which two have a delivery due, each reads a few pages (EXPLAIN
(ANALYZE, BUFFERS) on real tables). A statement that came to scan a table, or to probe every
merchant, would read hundreds and fail here, long before a year of sales or a platform's merchants
made it slow (docs/benchmarks.md, "Growth")."""
from __future__ import annotations

import uuid

import asyncpg

from cutylib.testing.plans import explained, nodes, pages
from payments.checkout.metrics import NON_TERMINAL, SAGAS_BY_STATE
from payments.checkout.repository import CLAIM_DUE
from payments.metrics import NON_TERMINAL_PAYMENTS
from payments.repository import CLAIM_RECONCILE
from payments.ops.queries import STUCK
from payments.outbound.repository import CLAIM_MERCHANTS, GAUGES, REARM, REARM_BATCH, REARM_LOCK
from payments.webhooks import RESOLVE_AND_STORE

MERCHANT = "merchant-periodic-plan"
ROWS = 20_000
# A probe of an index or two, whatever the tables hold (a scan of 20,000 rows reads 500 and more).
MAX_PAGES = 40
BIG = ("checkouts", "payments", "webhook_deliveries", "merchant_events", "webhook_endpoints",
       "webhook_merchants_due")
# Tables as small as the work queued (here: none): read whole or by index, their pages count too.
QUEUES = ("sagas_live", "payments_live")
# Merchants with an endpoint each, each with a retry an hour away (a due mark, not due yet), and two
# of them with a delivery due now.
SHOPS = 2_000
DUE_SHOPS = ["shop-7", "shop-1500"]

FILL = f"""
WITH c AS (
    INSERT INTO checkouts (id, customer_id, kind, state, outcome, slot_id, product_id, quantity, order_id,
                           amount_minor, currency, expire_time, payment_key, payment_id, payment_method, created_at,
                           updated_at, merchant_id)
    SELECT md5('co' || g)::uuid, 'c-' || (g % 500), 'codes', 'COMPLETED', NULL, NULL, md5('p')::uuid, 1,
           md5('co' || g)::uuid, 2500, 'TRY', now() - make_interval(secs => g) + interval '10 minutes',
           md5('key' || g)::uuid, md5('pay' || g)::uuid, 'pm_card_ok', now() - make_interval(secs => g),
           now() - make_interval(secs => g), $1
    FROM generate_series(1, {ROWS}) g RETURNING 1
), p AS (
    INSERT INTO payments (id, checkout_id, customer_id, status, version, psp_intent_id, amount_minor, currency,
                          payment_method, idempotency_key, created_at, updated_at, merchant_id)
    SELECT md5('pay' || g)::uuid, md5('co' || g)::uuid, 'c-' || (g % 500), 'succeeded', 3, 'pi_' || g, 2500, 'TRY',
           'pm_card_ok', md5('key' || g)::uuid::text, now() - make_interval(secs => g),
           now() - make_interval(secs => g), $1
    FROM generate_series(1, {ROWS}) g RETURNING 1
), e AS (
    INSERT INTO merchant_events (merchant_id, id, type, checkout_id, payload, created_at)
    SELECT $1, md5('ev' || g)::uuid, 'checkout.completed', md5('co' || g)::uuid, '{{}}',
           now() - make_interval(secs => g)
    FROM generate_series(1, {ROWS}) g RETURNING 1
), w AS (
    INSERT INTO webhook_endpoints (merchant_id, id, url, events, created_by, secret_key_id, secret_nonce,
                                   secret_ciphertext)
    VALUES ($1, md5('ep')::uuid, 'https://shop.example/hooks', ARRAY['checkout.completed'], 'test', 'k1',
            substr(sha256('k'::bytea), 1, 12), sha256('k'::bytea) || sha256('k'::bytea)) RETURNING 1
)
SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM p) + (SELECT count(*) FROM e) + (SELECT count(*) FROM w)
"""
SHOP_ENDPOINTS = f"""
INSERT INTO webhook_endpoints (merchant_id, id, url, events, created_by, secret_key_id, secret_nonce,
                               secret_ciphertext)
SELECT 'shop-' || m, md5('ep' || m)::uuid, 'https://shop-' || m || '.example/hooks', ARRAY['checkout.completed'],
       'test', 'k1', substr(sha256('k'::bytea), 1, 12), sha256('k'::bytea) || sha256('k'::bytea)
FROM generate_series(1, {SHOPS}) m
"""
SHOP_MARKS = f"""
INSERT INTO webhook_merchants_due (merchant_id, due_at)
SELECT 'shop-' || m, now() + interval '1 hour' FROM generate_series(1, {SHOPS}) m
"""
# Written as the outbox writes them (its triggers on): each marks its merchant due.
DUE_DELIVERY = """
WITH e AS (
    INSERT INTO merchant_events (merchant_id, id, type, payload) VALUES ($1, gen_random_uuid(), 'checkout.completed', '{}')
    RETURNING merchant_id, id
)
INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, next_attempt_at, give_up_at)
SELECT e.merchant_id, md5('ep' || substr(e.merchant_id, 6))::uuid, e.id, now(), now() + interval '3 days' FROM e
"""
DELIVERIES = f"""
INSERT INTO webhook_deliveries (merchant_id, id, endpoint_id, event_id, state, attempts, give_up_at, delivered_at,
                                created_at)
SELECT $1, md5('dl' || g)::uuid, md5('ep')::uuid, md5('ev' || g)::uuid, 'delivered', 1, now() + interval '3 days',
       now() - make_interval(secs => g), now() - make_interval(secs => g)
FROM generate_series(1, {ROWS}) g
"""


# (what, statement, its arguments): as the services run them.
STATEMENTS = [
    ("saga workers' claim", CLAIM_DUE, ("test", 50, 30.0)),
    ("payments gauge", NON_TERMINAL_PAYMENTS, (60.0,)),
    ("sagas gauge", SAGAS_BY_STATE, (list(NON_TERMINAL),)),
    ("outbound gauges", GAUGES, ()),
    ("delivery workers' claim", CLAIM_MERCHANTS, (20, 4, 8, 5)),
    ("delivery workers' due marks locked to re-arm", REARM_LOCK, (REARM_BATCH,)),
    ("delivery workers' re-arm of the due marks", REARM, (DUE_SHOPS,)),
    ("webhook's payment lookup, by intent", RESOLVE_AND_STORE,
     (None, "pi_777", None, "evt_plan_intent", "payment_intent.succeeded", "{}", "succeeded", 5.0, ["processing"])),
    ("webhook's payment lookup, by key", RESOLVE_AND_STORE,
     (None, None, str(uuid.UUID(bytes=bytes(16))), "evt_plan_key", "payment_intent.succeeded", "{}", "succeeded",
      5.0, ["processing"])),
]


async def _reads(conn) -> dict[str, list[tuple[str, str, int]]]:
    """Each statement's scan nodes on the filled tables with the pages each read; the statements
    run (EXPLAIN ANALYZE) and are undone."""
    found = {}
    for what, sql, args in STATEMENTS:
        plan = await explained(conn, sql, *args)
        # The pages of the filled tables each scan node read (a bitmap scan's include its
        # index's); whatever else the statement does (a function's first plans) is not the
        # tables' size, nor are the rows a statement writes (its ModifyTable node's pages).
        found[what] = [(n["Node Type"], n["Relation Name"], pages(n)) for n in nodes(plan)
                       if n.get("Relation Name") in BIG + QUEUES and n["Node Type"] != "ModifyTable"]
    return found


async def test_the_periodic_statements_read_pages_not_the_tables(own_database):
    """On a database of the test's own (in the session's shared one, other tests' unfinished
    payments and due work, which a gauge or a claim rightly reads, set what it read and even its
    plan): with the fill, each statement reads at most MAX_PAGES of the filled tables."""
    conn = await asyncpg.connect(await own_database("payments"))
    tx = conn.transaction()
    await tx.start()
    try:
        # The rows as a year's finished purchases leave them; their triggers (events, notifications)
        # are not what is measured.
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.fetchval(FILL, MERCHANT)
        await conn.execute(DELIVERIES, MERCHANT)
        await conn.execute(SHOP_ENDPOINTS)
        await conn.execute(SHOP_MARKS)
        await conn.execute("SET LOCAL session_replication_role = DEFAULT")
        for shop in DUE_SHOPS:
            await conn.execute(DUE_DELIVERY, shop)
        for table in BIG + QUEUES:
            await conn.execute(f"ANALYZE {table}")
        found = await _reads(conn)
        assert all(found.values()), found
        assert not {w: r for w, r in found.items() if any(n[0] == "Seq Scan" and n[1] in BIG for n in r)}, found
        assert not {w: r for w, r in found.items() if sum(n[2] for n in r) > MAX_PAGES}, found
    finally:
        await tx.rollback()
        await conn.close()


# Sagas scheduled for later (a 3-D Secure wait, a retry's backoff): in the workers' queue, not due.
SCHEDULED = """
INSERT INTO checkouts (id, customer_id, kind, state, product_id, quantity, order_id, amount_minor, currency,
                       expire_time, next_run_at, merchant_id)
SELECT gen_random_uuid(), 'c-' || g, 'codes', 'PENDING', md5('p')::uuid, 1, gen_random_uuid(), 2500, 'TRY',
       now() + interval '1 hour', now() + make_interval(secs => $2::int * (g + 600)), $1
FROM generate_series(1, $3::int) g
"""


async def test_the_saga_workers_claim_stops_at_the_last_due_saga(own_database):
    """Among 2,000 sagas scheduled for later and 3 due, a worker's claim reads the 3: its scan of the
    queue is bounded by the time the statement began, not filtered row by row to the queue's end."""
    conn = await asyncpg.connect(await own_database("payments"))
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute(SCHEDULED, MERCHANT, 1, 2_000)
        await conn.execute(SCHEDULED, MERCHANT, -1, 3)  # due 10 minutes ago and more
        assert await conn.fetchval("SELECT count(*) FROM sagas_live") == 2_003  # written with them
        await conn.execute("ANALYZE checkouts")
        await conn.execute("ANALYZE sagas_live")
        plan = await explained(conn, CLAIM_DUE, "test", 50, 30.0)
        scans = [n for n in nodes(plan) if n.get("Relation Name") in ("checkouts", "sagas_live")
                 and n["Node Type"] != "ModifyTable"]
        assert plan["Actual Rows"] == 3
        assert sum(n.get("Rows Removed by Filter", 0) for n in scans) == 0, scans
        assert sum(pages(n) for n in scans) <= MAX_PAGES, scans
    finally:
        await tx.rollback()
        await conn.close()


async def test_the_claim_and_the_gauges_read_no_history_of_reschedules(own_database):
    """The saga workers' claim and the stuck-saga gauges cost what is live, not how often the
    history's sagas changed: 80,000 changes of 20,000 sagas, all finished since, leave nothing on
    their way. Autovacuum is off on `checkouts` here, as it is for long stretches on a table of
    millions (it comes after a fifth of the table changed); the live sagas' table is vacuumed once
    the history has finished, as autovacuum does every round for a table its size. The claim and the
    gauges used to walk partial indexes of `checkouts`, whose dead entries only a VACUUM of
    `checkouts` removes: the old claim read 60,393 pages here, then 328 once its first call had
    marked them dead."""
    dsn = await own_database("payments")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ALTER TABLE checkouts SET (autovacuum_enabled = false)")
        await conn.execute(SCHEDULED, MERCHANT, -1, 20_000)  # due since 10 minutes ago and more
        for _ in range(2):  # each saga taken and released twice
            await conn.execute("UPDATE checkouts SET next_run_at = next_run_at + interval '1 second', "
                               "updated_at = clock_timestamp() WHERE merchant_id = $1", MERCHANT)
        await conn.execute("UPDATE checkouts SET state = 'REJECTED', version = version + 1, next_run_at = NULL, "
                           "updated_at = clock_timestamp() "
                           "WHERE merchant_id = $1", MERCHANT)
        await _live_after_history(conn, SCHEDULED, "sagas_live", "checkouts")
        await _within_pages(conn, ("checkouts", "sagas_live"), ((CLAIM_DUE, ("test", 50, 30.0), 3),
                                                                (SAGAS_BY_STATE, (list(NON_TERMINAL),), 1),
                                                                (STUCK, (0.0, 10), 10)))
    finally:
        await conn.close()


# Payments as the core writes them (no checkout: the reconciler and the gauge read payments alone).
PAYMENTS = """
INSERT INTO payments (id, customer_id, status, version, amount_minor, currency, payment_method, idempotency_key,
                      reconcile_at, merchant_id)
SELECT gen_random_uuid(), 'c-' || g, 'created', 1, 2500, 'TRY', 'pm_card_ok', gen_random_uuid()::text,
       now() + make_interval(secs => $2::int * (g + 600)), $1
FROM generate_series(1, $3::int) g
"""


async def test_the_reconciler_and_the_payments_gauge_read_no_history_of_payments(own_database):
    """The reconciler's claim and the payments gauge cost what is not final, not how many payments
    changed before: 20,000 payments that went created -> processing -> succeeded leave nothing on
    their way, with `payments` not vacuumed (as for long stretches on a table of millions). They used
    to walk `payments_reconcile_due`, a partial index of `payments` whose dead entries only a VACUUM
    of the whole table removes."""
    conn = await asyncpg.connect(await own_database("payments"))
    try:
        await conn.execute("ALTER TABLE payments SET (autovacuum_enabled = false)")
        await conn.execute(PAYMENTS, MERCHANT, -1, 20_000)  # due since 10 minutes ago and more
        await conn.execute("UPDATE payments SET status = 'processing', version = version + 1, "
                           "updated_at = clock_timestamp() WHERE merchant_id = $1", MERCHANT)
        await conn.execute("UPDATE payments SET status = 'succeeded', version = version + 1, reconcile_at = NULL, "
                           "updated_at = clock_timestamp() WHERE merchant_id = $1", MERCHANT)
        await _live_after_history(conn, PAYMENTS, "payments_live", "payments")
        await _within_pages(conn, ("payments", "payments_live"), ((CLAIM_RECONCILE, (50, "test", 30.0, 5.0), 3),
                                                                  (NON_TERMINAL_PAYMENTS, (60.0,), 1)))
    finally:
        await conn.close()


async def _within_pages(conn, tables: tuple[str, ...], cases) -> None:
    """Each (statement, arguments, rows it answers), run (EXPLAIN ANALYZE) and undone: it answers those
    rows, and its scans of `tables` read at most a probe's pages and a few for each row answered (a
    row's key and the row)."""
    tx = conn.transaction()
    await tx.start()
    try:
        for sql, args, rows in cases:
            plan = await explained(conn, sql, *args)
            scans = [n for n in nodes(plan) if n.get("Relation Name") in tables and n["Node Type"] != "ModifyTable"]
            assert plan["Actual Rows"] == rows, sql
            assert sum(pages(n) for n in scans) <= MAX_PAGES + 4 * rows, \
                (sql, [(n["Node Type"], n.get("Index Name"), pages(n)) for n in nodes(plan)])
    finally:
        await tx.rollback()


async def _live_after_history(conn, fill: str, live: str, history: str) -> None:
    """The history has finished every row it wrote (none is left in `live`); `live` is vacuumed, as
    autovacuum does a table its size every round; then `fill` writes 50 rows due later and 3 due
    now, and both tables are analysed."""
    assert await conn.fetchval(f"SELECT count(*) FROM {live}") == 0
    await conn.execute(f"VACUUM {live}")
    await conn.execute(fill, MERCHANT, 1, 50)  # later
    await conn.execute(fill, MERCHANT, -1, 3)  # due, after the finished ones in time order
    assert await conn.fetchval(f"SELECT count(*) FROM {live}") == 53
    await conn.execute(f"ANALYZE {live}")
    await conn.execute(f"ANALYZE {history}")
