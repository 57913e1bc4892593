"""The statements that run every few seconds on every replica (the saga workers' claim, the gauges)
and the webhook's payment lookup read what they are about, not the tables: on 20,000 finished
checkouts with their payments, deliveries and events, each reads a few pages (EXPLAIN (ANALYZE,
BUFFERS) on real tables). A statement that came to scan a table would read hundreds and fail here,
long before a year of sales made it slow (docs/benchmarks.md, "Growth")."""
from __future__ import annotations

import json
import uuid

import asyncpg

from payments.checkout.metrics import NON_TERMINAL, SAGAS_BY_STATE
from payments.checkout.repository import CLAIM_DUE
from payments.metrics import NON_TERMINAL_PAYMENTS
from payments.outbound.repository import GAUGES
from payments.webhooks import RESOLVE_AND_STORE

MERCHANT = "merchant-periodic-plan"
ROWS = 20_000
# A probe of an index or two, whatever the tables hold (a scan of 20,000 rows reads 500 and more).
MAX_PAGES = 40
BIG = ("checkouts", "payments", "webhook_deliveries", "merchant_events")

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
DELIVERIES = f"""
INSERT INTO webhook_deliveries (merchant_id, id, endpoint_id, event_id, state, attempts, give_up_at, delivered_at,
                                created_at)
SELECT $1, md5('dl' || g)::uuid, md5('ep')::uuid, md5('ev' || g)::uuid, 'delivered', 1, now() + interval '3 days',
       now() - make_interval(secs => g), now() - make_interval(secs => g)
FROM generate_series(1, {ROWS}) g
"""


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


# (what, statement, its arguments): as the services run them.
STATEMENTS = [
    ("saga workers' claim", CLAIM_DUE, ("test", 50, 30.0)),
    ("payments gauge", NON_TERMINAL_PAYMENTS, (60.0,)),
    ("sagas gauge", SAGAS_BY_STATE, (list(NON_TERMINAL),)),
    ("outbound gauges", GAUGES, ()),
    ("webhook's payment lookup, by intent", RESOLVE_AND_STORE,
     (None, "pi_777", None, "evt_plan_intent", "payment_intent.succeeded", "{}", "succeeded", 5.0, ["processing"])),
    ("webhook's payment lookup, by key", RESOLVE_AND_STORE,
     (None, None, str(uuid.UUID(bytes=bytes(16))), "evt_plan_key", "payment_intent.succeeded", "{}", "succeeded",
      5.0, ["processing"])),
]


async def test_the_periodic_statements_read_pages_not_the_tables(payments_dsn):
    conn = await asyncpg.connect(payments_dsn)
    tx = conn.transaction()
    await tx.start()
    try:
        # The rows as a year's finished purchases leave them; their triggers (events, notifications)
        # are not what is measured.
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.fetchval(FILL, MERCHANT)
        await conn.execute(DELIVERIES, MERCHANT)
        await conn.execute("SET LOCAL session_replication_role = DEFAULT")
        for table in BIG:
            await conn.execute(f"ANALYZE {table}")
        found = {}
        for what, sql, args in STATEMENTS:
            (doc,) = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args))
            # The pages of the filled tables each scan node read (a bitmap scan's include its
            # index's); whatever else the statement does (a function's first plans) is not the
            # tables' size.
            found[what] = [(n["Node Type"], n["Relation Name"],
                            n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0))
                           for n in _nodes(doc["Plan"]) if n.get("Relation Name") in BIG]
        assert all(found.values()), found
        assert not {w: r for w, r in found.items() if any(n[0] == "Seq Scan" for n in r)}, found
        assert not {w: r for w, r in found.items() if sum(n[2] for n in r) > MAX_PAGES}, found
    finally:
        await tx.rollback()
        await conn.close()
