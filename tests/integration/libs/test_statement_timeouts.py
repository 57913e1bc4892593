"""No statement runs for ever, whoever runs it (docs/security.md, "Database roles"): every role that
can log in to a service's database has a statement timeout (the services' and the webhook delivery
process's own, shorter; the owner's and anyone else's from the database), and migrations run under
a bound of their own (CUTY_MIGRATION_STATEMENT_TIMEOUT, an hour by default), in a transaction or not."""
from __future__ import annotations

import uuid

import asyncpg
import pytest

from cutylib.config import WEBHOOKS_OUT_DB_ROLE, with_user
from cutylib.db import SERVICE_STATEMENT_TIMEOUT, migrate
from cutylib.testing.postgres import ensure_service_roles


def _ms(setting: str) -> float:
    units = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
    for unit in sorted(units, key=len, reverse=True):
        if setting.endswith(unit):
            return float(setting[: -len(unit)]) * units[unit]
    return float(setting)


async def _timeout_of(dsn: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SHOW statement_timeout")
    finally:
        await conn.close()


async def test_every_role_that_connects_has_a_statement_timeout(pg, booking_dsn, codepool_dsn, payments_dsn):
    await ensure_service_roles(pg.dsn)
    person = f"person_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg.dsn)
    await admin.execute(f"CREATE ROLE {person} LOGIN")  # a person's psql, a tool: nothing set for it
    try:
        for service, dsn in (("booking", booking_dsn), ("codepool", codepool_dsn), ("payments", payments_dsn)):
            await admin.execute(f'GRANT CONNECT ON DATABASE "cuty_{service}" TO {person}')
            seen = {"owner": await _timeout_of(dsn), "person": await _timeout_of(with_user(dsn, person)),
                    "service": await _timeout_of(with_user(dsn, f"{service}_service"))}
            if service == "payments":
                seen["webhooks-out"] = await _timeout_of(with_user(dsn, WEBHOOKS_OUT_DB_ROLE))
            for who, setting in seen.items():
                assert 0 < _ms(setting) <= 60_000, (service, who, setting)
            assert _ms(seen["service"]) == _ms(SERVICE_STATEMENT_TIMEOUT)
    finally:
        await admin.execute(f"DROP OWNED BY {person}")
        await admin.execute(f"DROP ROLE {person}")
        await admin.close()


@pytest.mark.parametrize("marker", ["", "-- cuty:no-transaction\n"], ids=["in-transaction", "no-transaction"])
async def test_migrations_run_under_their_own_bound(scratch_db, tmp_path, monkeypatch, marker):
    (tmp_path / "0001_seen.sql").write_text(
        f"{marker}CREATE TABLE seen AS SELECT current_setting('statement_timeout') AS v;")
    monkeypatch.delenv("CUTY_MIGRATION_STATEMENT_TIMEOUT", raising=False)
    await migrate(scratch_db, tmp_path, shared=False)
    conn = await asyncpg.connect(scratch_db)
    try:
        assert _ms(await conn.fetchval("SELECT v FROM seen")) == 3_600_000
    finally:
        await conn.close()
    (tmp_path / "0002_seen.sql").write_text(
        f"{marker}CREATE TABLE seen2 AS SELECT current_setting('statement_timeout') AS v;")
    monkeypatch.setenv("CUTY_MIGRATION_STATEMENT_TIMEOUT", "90")
    await migrate(scratch_db, tmp_path, shared=False)
    conn = await asyncpg.connect(scratch_db)
    try:
        assert _ms(await conn.fetchval("SELECT v FROM seen2")) == 90_000
    finally:
        await conn.close()
