"""Each service connects as a database role that owns nothing, cannot change Row-Level Security, and
sees no merchant's row until a path says whose (docs/security.md, "Database roles"; docs/tenancy.md)."""
from __future__ import annotations

import asyncpg
import pytest

from cutylib.config import db_role_for
from cutylib.db import ALL_MERCHANTS, MERCHANT_SETTING
from cutylib.testing.tenancy import tenant_tables

SERVICES = ("booking", "codepool", "payments")


@pytest.fixture
def dsns(booking_dsn, codepool_dsn, payments_dsn, booking_service_dsn, codepool_service_dsn, payments_service_dsn):
    """service -> (the superuser's DSN, the service role's DSN) of its migrated database."""
    return {"booking": (booking_dsn, booking_service_dsn), "codepool": (codepool_dsn, codepool_service_dsn),
            "payments": (payments_dsn, payments_service_dsn)}


async def _seed(owner: asyncpg.Connection, service: str) -> None:
    """At least one merchant's row, so "no rows" is not an empty table's answer."""
    if service == "booking":
        await owner.execute("INSERT INTO salons (id, merchant_id, name, time_zone) "
                            "VALUES (gen_random_uuid(), 'role-test', 'salon', 'UTC')")
    elif service == "codepool":
        await owner.execute("INSERT INTO products (id, merchant_id, sku, name, price_minor, currency) "
                            "VALUES (gen_random_uuid(), 'role-test', 'sku-' || gen_random_uuid(), 'p', 100, 'EUR')")
    # payments' checkouts come from its own tests (a checkout needs the saga to exist)


@pytest.mark.parametrize("service", SERVICES)
async def test_no_merchant_set_sees_no_row_of_any_merchant_table(dsns, service):
    owner_dsn, service_dsn = dsns[service]
    owner = await asyncpg.connect(owner_dsn)
    role = await asyncpg.connect(service_dsn)
    try:
        await _seed(owner, service)
        assert await role.fetchval("SELECT current_user") == db_role_for(service)
        tables = [t["table"] for t in await tenant_tables(owner)]
        assert tables
        seen_any = 0
        for table in tables:
            total = await owner.fetchval(f"SELECT count(*) FROM {table}")
            # a plain statement, no merchant said: the role's default is nobody's
            assert await role.fetchval(f"SELECT count(*) FROM {table}") == 0, table
            async with role.transaction():
                await role.execute("SELECT set_config($1, $2, true)", MERCHANT_SETTING, ALL_MERCHANTS)
                assert await role.fetchval(f"SELECT count(*) FROM {table}") == total, table
            seen_any += total
        if service != "payments":
            assert seen_any > 0
    finally:
        await role.close()
        await owner.close()


@pytest.mark.parametrize("service", SERVICES)
async def test_the_service_role_owns_nothing_and_cannot_turn_row_level_security_off(dsns, service):
    owner_dsn, service_dsn = dsns[service]
    role = await asyncpg.connect(service_dsn)
    try:
        me = db_role_for(service)
        attrs = await role.fetchrow("SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolconfig "
                                    "FROM pg_roles WHERE rolname = $1", me)
        assert not (attrs["rolsuper"] or attrs["rolbypassrls"] or attrs["rolcreaterole"] or attrs["rolcreatedb"])
        assert f"{MERCHANT_SETTING}=" in attrs["rolconfig"]  # the role's default: no merchant
        assert any(c.startswith("statement_timeout=") for c in attrs["rolconfig"])
        owned = await role.fetch("""
            SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = $1)
            UNION ALL
            SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'public' AND p.proowner = (SELECT oid FROM pg_roles WHERE rolname = $1)""", me)
        assert owned == []
        table = (await tenant_tables(role))[0]["table"]
        for ddl in (f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY", f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY",
                    f"DROP POLICY merchant_isolation ON {table}", f"CREATE TABLE role_test_{service} (x int)",
                    "CREATE OR REPLACE FUNCTION cuty_merchant_visible(m text) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
                    "DELETE FROM schema_migrations"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await role.execute(ddl)
    finally:
        await role.close()
