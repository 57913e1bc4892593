"""The shared database parts against a real PostgreSQL: unit of work and migration runner."""
import asyncio

import asyncpg
import pytest

from cutylib.db import MigrationError, UnitOfWork, migrate


async def test_unit_of_work_rolls_back_unless_committed(scratch_pool):
    await scratch_pool.execute("CREATE TABLE t (v int)")
    async with UnitOfWork(scratch_pool) as uow:
        await uow.conn.execute("INSERT INTO t VALUES (1)")
        # leaves without commit()
    async with UnitOfWork(scratch_pool) as uow:
        await uow.conn.execute("INSERT INTO t VALUES (2)")
        await uow.commit()
    with pytest.raises(RuntimeError):
        async with UnitOfWork(scratch_pool) as uow:
            await uow.conn.execute("INSERT INTO t VALUES (3)")
            raise RuntimeError("boom")
    assert [r["v"] for r in await scratch_pool.fetch("SELECT v FROM t ORDER BY v")] == [2]


async def test_migrations_apply_once_even_with_concurrent_replicas(scratch_db, tmp_path):
    (tmp_path / "0001_init.sql").write_text("CREATE TABLE a (id int PRIMARY KEY);")
    (tmp_path / "0002_more.sql").write_text("INSERT INTO a VALUES (1);")
    results = await asyncio.gather(*(migrate(scratch_db, tmp_path, shared=False) for _ in range(5)))
    assert sorted(len(r) for r in results) == [0, 0, 0, 0, 2]
    conn = await asyncpg.connect(scratch_db)
    try:
        assert await conn.fetchval("SELECT count(*) FROM a") == 1
        assert [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")] == [
            "0001_init", "0002_more"]
    finally:
        await conn.close()


async def test_changed_migration_is_refused(scratch_db, tmp_path):
    (tmp_path / "0001_init.sql").write_text("CREATE TABLE a (id int);")
    await migrate(scratch_db, tmp_path, shared=False)
    (tmp_path / "0001_init.sql").write_text("CREATE TABLE a (id bigint);")
    with pytest.raises(MigrationError):
        await migrate(scratch_db, tmp_path, shared=False)


async def test_failed_migration_leaves_nothing_behind(scratch_db, tmp_path):
    (tmp_path / "0001_bad.sql").write_text("CREATE TABLE b (id int); SELECT no_such_function();")
    with pytest.raises(asyncpg.PostgresError):
        await migrate(scratch_db, tmp_path, shared=False)
    conn = await asyncpg.connect(scratch_db)
    try:
        assert await conn.fetchval("SELECT to_regclass('b')") is None
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == 0
    finally:
        await conn.close()
