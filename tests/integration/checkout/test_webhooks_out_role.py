"""The webhook delivery process connects as a database role of its own (`payments_webhooks_out`):
it delivers (claims, signs, POSTs, records the attempt, moves the endpoint's circuit) and can do
nothing else in the payments database: no checkout, payment, refund or PSP event, no endpoint
created or deleted, no merchant's row without saying whose (docs/security.md, "Database roles")."""
from __future__ import annotations

import uuid

import asyncpg
import pytest

from cutylib.config import WEBHOOKS_OUT_DB_ROLE, with_user
from cutylib.db import ALL_MERCHANTS, create_pool, ensure_service_role
from cutylib.principal import Principal
from payments.outbound.worker import DeliveryWorker

from outbound_testkit import FAST
from test_checkout_webhook_fairness import publish, running, settled
from webhook_receiver import Receiver

pytestmark = pytest.mark.usefixtures("clean_endpoints")

# What delivery needs, and all it gets: table -> privileges (UPDATE: only the columns it moves).
NEEDED = {
    "merchant_events": {"SELECT"},
    "schema_migrations": {"SELECT"},
    "webhook_attempts": {"INSERT"},
    "webhook_deliveries": {"SELECT", "UPDATE"},
    "webhook_endpoints": {"SELECT", "UPDATE"},
    "webhook_merchants_due": {"SELECT", "INSERT", "UPDATE", "DELETE"},
}


@pytest.fixture
async def role_dsn(pg, checkout_dsn, checkout_pool):
    await ensure_service_role(pg.dsn, WEBHOOKS_OUT_DB_ROLE)
    return with_user(checkout_dsn, WEBHOOKS_OUT_DB_ROLE)


async def test_the_delivery_role_has_only_what_delivery_needs(pg, checkout_dsn, role_dsn):
    owner = await asyncpg.connect(checkout_dsn)
    role = await asyncpg.connect(role_dsn)
    try:
        granted: dict[str, set[str]] = {}
        for t in await owner.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"):
            for priv in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"):
                whole = await owner.fetchval("SELECT has_table_privilege($1, $2, $3)", WEBHOOKS_OUT_DB_ROLE,
                                             t["tablename"], priv)
                some = priv in ("SELECT", "INSERT", "UPDATE", "REFERENCES") and await owner.fetchval(
                    "SELECT has_any_column_privilege($1, $2, $3)", WEBHOOKS_OUT_DB_ROLE, t["tablename"], priv)
                if whole or some:
                    granted.setdefault(t["tablename"], set()).add(priv)
        assert granted == NEEDED
        # UPDATE only of the columns delivery moves: never an endpoint's URL, events or secret
        for column in ("url", "events", "secret", "secret_ciphertext", "merchant_id"):
            assert not await owner.fetchval("SELECT has_column_privilege($1, 'webhook_endpoints', $2, 'UPDATE')",
                                            WEBHOOKS_OUT_DB_ROLE, column), column
        attrs = await owner.fetchrow("SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolconfig "
                                     "FROM pg_roles WHERE rolname = $1", WEBHOOKS_OUT_DB_ROLE)
        assert not (attrs["rolsuper"] or attrs["rolbypassrls"] or attrs["rolcreaterole"] or attrs["rolcreatedb"])
        assert any(c.startswith("statement_timeout=") for c in attrs["rolconfig"])
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await role.fetch("SELECT * FROM checkouts LIMIT 1")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await role.execute("DELETE FROM webhook_endpoints")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await role.execute("UPDATE webhook_endpoints SET url = 'https://elsewhere.example/'")
        # no merchant said: no rows
        assert await role.fetchval("SELECT count(*) FROM webhook_deliveries") == 0
    finally:
        await role.close()
        await owner.close()


async def test_a_worker_connected_as_the_delivery_role_delivers(checkout_pool, endpoints, role_dsn):
    admin = Principal("admin-role", "admin", f"merchant-role-{uuid.uuid4().hex[:6]}")
    pool = await create_pool(role_dsn, min_size=1, max_size=4, merchant=ALL_MERCHANTS)
    try:
        # The first answer a 500: the retry marks its merchant due, as this role (webhook_merchants_due).
        async with Receiver(fail_first=1) as rx:
            ep = await endpoints.create(admin, rx.url, ["checkout.completed"])
            rx.secrets.append(ep.secret)
            async with running([DeliveryWorker(pool, "role-test:0", FAST)]):
                event = await publish(checkout_pool, admin.org, [ep.id])
                await rx.until(lambda evs: event in evs, timeout=15)
                await settled(checkout_pool, admin.org)
        row = await checkout_pool.fetchrow(
            "SELECT d.state, (SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id) AS attempts "
            "FROM webhook_deliveries d WHERE d.merchant_id = $1", admin.org)
        assert dict(row) == {"state": "delivered", "attempts": 2}
    finally:
        await pool.close()
