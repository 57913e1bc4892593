"""The shared database parts against a real PostgreSQL: unit of work and migration runner."""
import asyncio

import asyncpg
import pytest

from cutylib.db import MigrationError, UnitOfWork, migrate, pending_migrations
from cutylib.testing.procs import wait_for


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


async def test_a_pool_statement_that_loses_a_deadlock_runs_again_and_takes_effect_once(scratch_db, scratch_pool):
    """A statement run by the pool is its own transaction: chosen as a deadlock's victim it was
    rolled back whole, and the pool runs it again instead of handing the caller the error."""
    await scratch_pool.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
    await scratch_pool.execute("INSERT INTO t VALUES (1, 0), (2, 0)")
    other = await asyncpg.connect(scratch_db)
    try:
        # Who is the victim is decided by whose deadlock check runs first after the cycle closes:
        # each waiter checks once, deadlock_timeout after it began to wait. The statement checks 3 s
        # into its wait (a check made before `other` waits too finds no cycle, and is not made
        # again), `other` only after 30 s.
        await other.execute("SET deadlock_timeout = '30s'")
        tx = other.transaction()
        await tx.start()
        await other.execute("UPDATE t SET v = v + 10 WHERE id = 2")
        # takes row 1, then waits for row 2
        both = asyncio.create_task(scratch_pool.execute(
            "DO $$ BEGIN PERFORM set_config('deadlock_timeout', '3s', true); "
            "UPDATE t SET v = v + 1 WHERE id = 1; UPDATE t SET v = v + 1 WHERE id = 2; END $$"))
        # Watched from a transaction of its own each time: inside `other`'s open transaction
        # pg_stat_activity is read once and kept, and a first look before the statement waited never
        # changed.
        await wait_for(lambda: scratch_pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                                                     "'Lock' AND query LIKE 'DO $$%'"),
                       message="the pool's statement waiting for row 2")
        # row 1 now waits for the statement: a cycle, broken by rolling the statement back
        await asyncio.wait_for(other.execute("UPDATE t SET v = v + 10 WHERE id = 1"), timeout=10)
        assert not both.done()  # running again, and waiting for this transaction
        await tx.commit()
        await asyncio.wait_for(both, timeout=10)
    finally:
        await other.close()
    assert [tuple(r) for r in await scratch_pool.fetch("SELECT id, v FROM t ORDER BY id")] == [(1, 11), (2, 11)]


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


async def _versions(dsn):
    conn = await asyncpg.connect(dsn)
    try:
        return {r["version"]: r["checksum"] for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")}
    finally:
        await conn.close()


async def test_function_files_apply_first_and_again_when_changed(scratch_db, tmp_path):
    (tmp_path / "functions").mkdir()
    fn = tmp_path / "functions" / "double_it.sql"
    fn.write_text("CREATE OR REPLACE FUNCTION double_it() RETURNS trigger LANGUAGE plpgsql AS $$\n"
                  "BEGIN NEW.v := NEW.v * 2; RETURN NEW; END $$;")
    # The versioned migration declares a trigger on the function, which must already exist.
    (tmp_path / "0001_baseline.sql").write_text(
        "CREATE TABLE a (v int);\n"
        "CREATE TRIGGER a_double BEFORE INSERT ON a FOR EACH ROW EXECUTE FUNCTION double_it();")
    assert await migrate(scratch_db, tmp_path, shared=False) == ["functions/double_it", "0001_baseline"]
    assert await migrate(scratch_db, tmp_path, shared=False) == []  # unchanged: nothing applied
    fn.write_text(fn.read_text().replace("* 2", "* 3"))  # a changed function is a diff of one file
    assert await pending_migrations(scratch_db, tmp_path, shared=False) == ["functions/double_it"]
    assert await migrate(scratch_db, tmp_path, shared=False) == ["functions/double_it"]
    conn = await asyncpg.connect(scratch_db)
    try:
        await conn.execute("INSERT INTO a VALUES (5)")
        assert await conn.fetchval("SELECT v FROM a") == 15
    finally:
        await conn.close()
    assert await pending_migrations(scratch_db, tmp_path, shared=False) == []


async def test_a_retired_function_serves_the_migrations_that_name_it_and_stays_dropped(scratch_db, tmp_path):
    """A function dropped by a numbered migration, but declared by an older one (a trigger of the
    baseline): its stub in functions/retired/ lets a new database through the history, is applied
    once, and what the dropping migration removed stays removed."""
    (tmp_path / "functions" / "retired").mkdir(parents=True)
    stub = tmp_path / "functions" / "retired" / "fill_it.sql"
    stub.write_text("CREATE OR REPLACE FUNCTION fill_it() RETURNS trigger LANGUAGE plpgsql AS $$\n"
                    "BEGIN RETURN NEW; END $$;")
    (tmp_path / "0001_baseline.sql").write_text(
        "CREATE TABLE a (v int);\n"
        "CREATE TRIGGER a_fill BEFORE INSERT ON a FOR EACH ROW EXECUTE FUNCTION fill_it();")
    (tmp_path / "0002_drop_fill.sql").write_text(
        "DROP TRIGGER a_fill ON a; DROP FUNCTION fill_it(); ALTER TABLE a ADD CHECK (v IS NOT NULL);")
    assert await migrate(scratch_db, tmp_path, shared=False) == ["retired/fill_it", "0001_baseline", "0002_drop_fill"]
    assert await migrate(scratch_db, tmp_path, shared=False) == []
    assert await pending_migrations(scratch_db, tmp_path, shared=False) == []
    conn = await asyncpg.connect(scratch_db)
    try:
        assert await conn.fetchval("SELECT to_regproc('fill_it')") is None
    finally:
        await conn.close()
    stub.write_text(stub.read_text() + "\n")  # history: never changed once applied
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await migrate(scratch_db, tmp_path, shared=False)


async def test_a_failing_function_file_leaves_the_whole_change_out(scratch_db, tmp_path):
    (tmp_path / "functions").mkdir()
    (tmp_path / "0001_baseline.sql").write_text("CREATE TABLE a (v int);")
    await migrate(scratch_db, tmp_path, shared=False)
    (tmp_path / "0002_more.sql").write_text("CREATE TABLE b (v int);")
    (tmp_path / "functions" / "broken.sql").write_text("CREATE OR REPLACE FUNCTION broken() RETURNS int LANGUAGE sql AS $$ SELEC 1 $$;")
    with pytest.raises(asyncpg.PostgresError):
        await migrate(scratch_db, tmp_path, shared=False)
    assert set(await _versions(scratch_db)) == {"0001_baseline"}  # 0002 was not applied without the function


async def test_two_migrations_with_one_number_are_refused(scratch_db, tmp_path):
    (tmp_path / "0101_a.sql").write_text("SELECT 1;")
    (tmp_path / "0101_b.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="share a number"):
        await migrate(scratch_db, tmp_path, shared=False)


async def test_a_database_of_the_history_before_the_baseline_is_refused_by_name(scratch_db, tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    (old / "0001_init.sql").write_text("CREATE TABLE a (v int);")
    (old / "0002_more.sql").write_text("ALTER TABLE a ADD COLUMN w int;")
    await migrate(scratch_db, old, shared=False)
    (new / "0001_baseline.sql").write_text("CREATE TABLE a (v int, w int);")
    with pytest.raises(MigrationError, match="recreate it"):
        await migrate(scratch_db, new, shared=False)


async def test_a_function_returning_a_tables_rows_waits_for_its_table(scratch_db, tmp_path):
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "newest_a.sql").write_text(
        "CREATE OR REPLACE FUNCTION newest_a() RETURNS SETOF a LANGUAGE sql AS $$ SELECT * FROM a ORDER BY v DESC LIMIT 1 $$;")
    (tmp_path / "0001_baseline.sql").write_text("CREATE TABLE a (v int); INSERT INTO a VALUES (1), (2);")
    assert set(await migrate(scratch_db, tmp_path, shared=False)) == {"functions/newest_a", "0001_baseline"}
    conn = await asyncpg.connect(scratch_db)
    try:
        assert await conn.fetchval("SELECT v FROM newest_a()") == 2
    finally:
        await conn.close()


async def test_a_unit_of_work_says_its_merchant_on_any_pool(scratch_db):
    """The merchant goes out with BEGIN on the platform's pools and as a statement of its own on a
    plain asyncpg pool; either way the transaction has it, and the next one does not."""
    from cutylib import principal
    from cutylib.db import ALL_MERCHANTS, MERCHANT_SETTING, create_pool

    setting = f"SELECT current_setting('{MERCHANT_SETTING}', true)"
    plain = await asyncpg.create_pool(scratch_db, min_size=1, max_size=1)
    ours = await create_pool(scratch_db, min_size=1, max_size=1, merchant=ALL_MERCHANTS, merchant_at_connect=False)
    try:
        for pool in (plain, ours):
            async with UnitOfWork(pool, merchant="m-1") as uow:
                assert await uow.conn.fetchval(setting) == "m-1"
            async with pool.acquire() as conn:
                assert await conn.fetchval(setting) in (None, "")
        # a caller of every merchant on a pool that says '*' per transaction; a merchant's user narrowed
        assert await ours.fetchval(setting) == ALL_MERCHANTS
        with principal.acting_as(principal.Principal("u", "staff", "m-2")):
            assert await ours.fetchval(setting) == "m-2"
            async with UnitOfWork(ours) as uow:
                assert await uow.conn.fetchval(setting) == "m-2"
    finally:
        await plain.close()
        await ours.close()


async def test_closing_a_pool_ends_within_its_grace_even_with_a_connection_never_given_back(scratch_db):
    """asyncpg's close waits for every connection to come back, without a bound: a worker that still
    holds one (or a connection waiting for a cancel acknowledgement that never comes) would hold a
    service's shutdown for ever. Our pools wait their grace, then cut what is left."""
    from cutylib.db import create_pool
    from cutylib.testing.postgres import owner_connection
    from cutylib.testing.procs import wait_for

    pool = await create_pool(scratch_db, min_size=1, max_size=2, application_name="held-for-ever")
    held = await pool.acquire()
    pid = await held.fetchval("SELECT pg_backend_pid()")
    async with owner_connection(scratch_db) as admin:
        closing = asyncio.create_task(pool.close(grace=0.5))
        done, _ = await asyncio.wait({closing}, timeout=10)
        assert done, "the pool's close did not end within 10 s"
        closing.result()
        gone = await wait_for(lambda: _backend_gone(admin, pid), timeout=5, message="the cut connection's backend to go")
        assert gone


async def _backend_gone(admin, pid: int) -> bool:
    return not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
