"""Row-Level Security, probed the way a service's own (non-superuser) database role meets it.

Tests connect as a superuser, which bypasses RLS. `probe_role` makes a fresh role without that
privilege (as a service's role in production is: the owner of its tables, bound by FORCE ROW LEVEL
SECURITY) and `rows_seen` counts a table's rows as that role under a given `cuty.merchant`.
"""
from __future__ import annotations

import contextlib
import uuid
from typing import AsyncIterator

import asyncpg

from ..db import MERCHANT_SETTING

# Tables with a merchant_id column, and whether RLS is enabled and forced on them with a policy. A
# partitioned table counts once, as the table the services name (its partitions: PARTITIONS_RLS).
TENANT_TABLES = """
SELECT c.relname AS table, c.relrowsecurity AS enabled, c.relforcerowsecurity AS forced,
       EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid) AS has_policy
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'merchant_id'
                                             AND NOT a.attisdropped)
ORDER BY c.relname
"""
# The partitions of merchants' tables: each is a table the services' role may name, so each keeps the
# policy (cuty_partitions_ahead, cuty_tenant_rls). A row is a partition without it.
PARTITIONS_WITHOUT_RLS = """
SELECT c.relname AS table
FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid JOIN pg_class parent ON parent.oid = i.inhparent
WHERE c.relnamespace = 'public'::regnamespace AND parent.relrowsecurity
  AND NOT (c.relrowsecurity AND c.relforcerowsecurity AND EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid))
"""


async def tenant_tables(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(TENANT_TABLES)


@contextlib.asynccontextmanager
async def probe_role(conn: asyncpg.Connection) -> AsyncIterator[str]:
    """A fresh role that may read every table of the database but is no superuser (dropped after)."""
    role = "rls_probe_" + uuid.uuid4().hex[:12]
    await conn.execute(f"CREATE ROLE {role} NOLOGIN NOSUPERUSER NOBYPASSRLS")
    await conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
    await conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        yield role
    finally:
        await conn.execute("RESET ROLE")
        await conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
        await conn.execute(f"REVOKE ALL ON SCHEMA public FROM {role}")
        await conn.execute(f"DROP ROLE {role}")


async def rows_seen(conn: asyncpg.Connection, role: str, table: str, merchant: str | None,
                    where: str = "true", *args) -> int:
    """How many rows of `table` (matching `where`) `role` sees with cuty.merchant = `merchant`
    (None: the setting unset, which is no merchant at all: RLS fails closed)."""
    async with conn.transaction():
        await conn.execute(f"SET LOCAL ROLE {role}")
        await conn.execute("SELECT set_config($1, $2, true)", MERCHANT_SETTING, merchant or "")
        return await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {where}", *args)
