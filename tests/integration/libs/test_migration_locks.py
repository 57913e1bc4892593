"""Migrations while the old version serves: each waits for a lock at most lock_timeout, rolls back
and tries again (so the serving version's queries never queue behind it for long), and a
`-- cuty:no-transaction` file runs outside the transaction (CREATE INDEX CONCURRENTLY)."""
import asyncio

import asyncpg
import pytest

from cutylib.db import migrate, pending_migrations


async def _setup(dsn, tmp_path):
    (tmp_path / "0001_init.sql").write_text("CREATE TABLE a (id int PRIMARY KEY, v int);")
    await migrate(dsn, tmp_path, shared=False)


async def test_a_blocked_migration_times_out_retries_and_succeeds_once_the_lock_is_free(scratch_db, tmp_path, caplog):
    await _setup(scratch_db, tmp_path)
    (tmp_path / "0002_column.sql").write_text("ALTER TABLE a ADD COLUMN w int;")
    serving = await asyncpg.connect(scratch_db)
    try:
        # The old version holds a lock on `a` (a long transaction) that ALTER TABLE must wait for.
        tx = serving.transaction()
        await tx.start()
        await serving.execute("LOCK TABLE a IN ACCESS SHARE MODE")
        with caplog.at_level("WARNING", logger="cutylib.db"):
            run = asyncio.create_task(migrate(scratch_db, tmp_path, shared=False, lock_timeout=0.1, attempts=20))
            await asyncio.sleep(1.2)
            assert not run.done()
            retries = [r for r in caplog.records if "retrying" in r.getMessage()]
            assert len(retries) >= 2  # it gave up the lock queue and tried again, more than once
            # While it waits between attempts, the serving version's writes are not queued behind it.
            other = await asyncpg.connect(scratch_db)
            try:
                await asyncio.wait_for(other.execute("INSERT INTO a VALUES (1, 1)"), timeout=1.0)
            finally:
                await other.close()
            await tx.commit()
        assert await asyncio.wait_for(run, timeout=30) == ["0002_column"]
        assert await serving.fetchval("SELECT count(*) FROM information_schema.columns WHERE table_name = 'a' AND column_name = 'w'") == 1
    finally:
        await serving.close()


async def test_a_migration_blocked_on_every_attempt_fails_and_applies_nothing(scratch_db, tmp_path):
    await _setup(scratch_db, tmp_path)
    (tmp_path / "0002_column.sql").write_text("ALTER TABLE a ADD COLUMN w int;")
    serving = await asyncpg.connect(scratch_db)
    try:
        async with serving.transaction():
            await serving.execute("LOCK TABLE a IN ACCESS SHARE MODE")
            with pytest.raises(asyncpg.LockNotAvailableError):
                await migrate(scratch_db, tmp_path, shared=False, lock_timeout=0.05, attempts=2)
        assert await pending_migrations(scratch_db, tmp_path, shared=False) == ["0002_column"]
    finally:
        await serving.close()


async def test_no_transaction_migrations_run_outside_it_after_it(scratch_db, tmp_path):
    await _setup(scratch_db, tmp_path)
    (tmp_path / "0002_index.sql").write_text(
        "-- cuty:no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS a_v ON a (v);\n")
    (tmp_path / "0003_table.sql").write_text("CREATE TABLE b (id int);")
    assert await pending_migrations(scratch_db, tmp_path, shared=False) == ["0002_index", "0003_table"]
    # In a transaction CREATE INDEX CONCURRENTLY fails; here it ran, after the transactional ones.
    assert await migrate(scratch_db, tmp_path, shared=False) == ["0003_table", "0002_index"]
    conn = await asyncpg.connect(scratch_db)
    try:
        assert await conn.fetchval("SELECT indisvalid FROM pg_index WHERE indexrelid = 'a_v'::regclass")
    finally:
        await conn.close()
    assert await migrate(scratch_db, tmp_path, shared=False) == []
    assert await pending_migrations(scratch_db, tmp_path, shared=False) == []


async def test_replicas_migrating_together_through_a_concurrent_index_both_start(scratch_db, tmp_path):
    # Two replicas of a new release start at once. One builds the index CONCURRENTLY while the other
    # waits for the migration lock: the waiter must hold no snapshot the build waits for (that was a
    # deadlock, and one replica exited), and each change is applied exactly once.
    await _setup(scratch_db, tmp_path)
    filler = await asyncpg.connect(scratch_db)
    try:
        await filler.execute("INSERT INTO a SELECT g, g FROM generate_series(1, 200000) g")
    finally:
        await filler.close()
    (tmp_path / "0002_index.sql").write_text(
        "-- cuty:no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS a_v ON a (v);\n")
    (tmp_path / "0003_index.sql").write_text(
        "-- cuty:no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS a_vid ON a (v, id);\n")
    runs = await asyncio.wait_for(asyncio.gather(*(migrate(scratch_db, tmp_path, shared=False) for _ in range(3))),
                                  timeout=120)
    assert sorted(v for run in runs for v in run) == ["0002_index", "0003_index"]
    conn = await asyncpg.connect(scratch_db)
    try:
        assert await conn.fetchval("SELECT bool_and(indisvalid) FROM pg_index WHERE indexrelid IN ('a_v'::regclass, 'a_vid'::regclass)")
    finally:
        await conn.close()
