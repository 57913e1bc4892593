"""Test helpers of the retention movers (cutylib.retention): a mover running rounds while a test's
live writes race it, and a table's columns (a history must have every column of its live table)."""
from __future__ import annotations

import asyncio
import contextlib

from cutylib.retention import Retention

COLUMNS = """
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""


async def columns(conn, table: str) -> list[tuple[str, str]]:
    """(name, type) of `table`'s columns, in order."""
    return [tuple(r) for r in await conn.fetch(COLUMNS, table)]


async def partitions(conn, table: str) -> dict[str, tuple]:
    """{partition: (lower, upper)} of a time-partitioned table (None: unbounded)."""
    return {r["partition"]: (r["lower"], r["upper"]) for r in
            await conn.fetch("SELECT * FROM cuty_partition_bounds($1)", table)}


@contextlib.asynccontextmanager
async def moving(job: Retention, name: str):
    """Runs `job`'s rounds back to back while the body runs; yields a dict whose "moved" is the rows
    of mover `name` moved so far (complete once the body is done)."""
    stop, moved = asyncio.Event(), {"moved": 0}

    async def rounds():
        while not stop.is_set():
            moved["moved"] += (await job.round()).moved[name]

    task = asyncio.create_task(rounds())
    try:
        yield moved
    finally:
        stop.set()
        await task


async def fresh_database(admin_dsn: str, service: str, repo) -> tuple[str, str]:
    """A new database with `service`'s migrations: (the owner's dsn, the service role's dsn)."""
    import uuid

    from cutylib.config import with_database
    from cutylib.db import migrate
    from cutylib.testing.postgres import service_dsn

    dsn = with_database(admin_dsn, f"{service}_retention_{uuid.uuid4().hex[:10]}")
    await migrate(dsn, repo / "services" / service / "migrations")
    return dsn, await service_dsn(admin_dsn, service, dsn)
