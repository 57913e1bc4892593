"""asyncpg pool, unit of work, and the forward-only migration runner."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import pathlib
from typing import Any

import asyncpg

from . import deadlines
from .config import env_float, env_int, with_database

log = logging.getLogger(__name__)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's default reset query.

    The default (`UNLISTEN *; RESET ALL; CLOSE ALL; pg_advisory_unlock_all()`) is one more round
    trip on every release, i.e. on every request, for session state our services never leave on a
    pooled connection: no SET, no cursors, only transaction-scoped advisory locks, and a LISTEN is
    removed before its connection goes back. asyncpg still rolls back an open transaction itself
    before calling this.
    """


# The Row-Level Security key of every merchant's table (libs/cutylib/migrations/functions/):
# unset or ALL_MERCHANTS sees every merchant; cutylib.tenancy.scoped narrows a transaction to one.
MERCHANT_SETTING = "cuty.merchant"
ALL_MERCHANTS = "*"

# Migrations every service database shares (tenancy functions), applied with the service's own.
SHARED_MIGRATIONS = pathlib.Path(__file__).parent / "migrations"

# How long a request waits for a pooled connection (CUTY_DB_ACQUIRE_TIMEOUT_SECONDS).
DEFAULT_ACQUIRE_TIMEOUT_SECONDS = 5.0


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 20,
                      acquire_timeout: float | None = DEFAULT_ACQUIRE_TIMEOUT_SECONDS, **kwargs: Any) -> asyncpg.Pool:
    """A pool whose sessions run in UTC with JSON codecs and no per-release reset round trip, and
    whose acquire gives up after `acquire_timeout` seconds (None: waits for ever)."""
    server_settings = {"timezone": "UTC", "application_name": kwargs.pop("application_name", "cuty")}
    server_settings.update(kwargs.pop("server_settings", {}))
    kwargs.setdefault("reset", _keep_session)
    kwargs.setdefault("timeout", 5)  # connect timeout: a database that does not answer is UNAVAILABLE soon
    # asyncpg.create_pool's own defaults, for the subclass below (it builds a Pool the same way).
    options: dict[str, Any] = dict(max_queries=50000, max_inactive_connection_lifetime=300.0, loop=None,
                                   connection_class=asyncpg.Connection, record_class=asyncpg.Record)
    options.update(kwargs)
    pool = BoundedPool(dsn, min_size=min_size, max_size=max_size, init=_init_connection,
                       server_settings=server_settings, **options)
    pool.acquire_timeout = acquire_timeout
    return await pool


class BoundedPool(asyncpg.Pool):
    """A pool whose acquire, unless given its own timeout, waits at most `acquire_timeout` seconds
    (issue 10, item 9): with every connection busy (slow queries, stalled streams) a request fails
    fast with TimeoutError, which the gRPC error mapping answers UNAVAILABLE (retryable), instead of
    queueing without end. The pool's fetch/execute helpers and UnitOfWork all acquire through it.

    Inside an RPC with a deadline (cutylib.deadlines) the wait is also cut at that deadline less a
    margin: a request whose deadline is (nearly) spent fails at once with DeadlineExceeded, without
    taking a connection, and one whose deadline passes while it waits gives up then, also with
    DeadlineExceeded (DEADLINE_EXCEEDED), rather than holding a place in the queue for a caller
    that is gone."""

    __slots__ = ("acquire_timeout",)

    def acquire(self, *, timeout: float | None = None):
        return super().acquire(timeout=self.acquire_timeout if timeout is None else timeout)

    async def _acquire(self, timeout: float | None):
        budget = deadlines.budget("wait for a database connection")
        if budget is None or (timeout is not None and timeout <= budget):
            return await super()._acquire(timeout)
        try:
            return await super()._acquire(budget)
        except asyncio.TimeoutError:
            raise deadlines.exceeded("wait for a database connection") from None


# BEGIN of each isolation level a unit of work may ask for.
_BEGIN = {"read_committed": "BEGIN ISOLATION LEVEL READ COMMITTED",
          "repeatable_read": "BEGIN ISOLATION LEVEL REPEATABLE READ",
          "serializable": "BEGIN ISOLATION LEVEL SERIALIZABLE"}


def begin_statement(isolation: str) -> str:
    """BEGIN, and inside an RPC with a deadline `SET LOCAL statement_timeout` to the time left
    (less the margin): one simple-query message, so bounding the statements by the deadline costs
    no round trip. PostgreSQL then cancels a statement the caller can no longer wait for
    (QueryCanceledError, answered DEADLINE_EXCEEDED) and nothing keeps running for it."""
    begin = _BEGIN[isolation]
    budget = deadlines.budget("start a transaction")
    if budget is None:
        return begin
    return f"{begin}; SET LOCAL statement_timeout = {max(1, int(budget * 1000))}"


class UnitOfWork:
    """One transaction on one connection that rolls back unless `commit()` is called.

    asyncpg's `transaction()` commits on a clean exit; a use case that returns early must not
    silently persist half its work, so this wrapper inverts the default.

        async with UnitOfWork(pool) as uow:
            await uow.conn.execute(...)
            await uow.commit()

    It sends BEGIN / COMMIT / ROLLBACK itself (not through asyncpg's Transaction) so that BEGIN can
    carry the deadline's statement_timeout in the same round trip (`begin_statement`). asyncpg
    therefore refuses `uow.conn.transaction()` inside it: use `uow.savepoint()`.
    """

    def __init__(self, pool: asyncpg.Pool, *, isolation: str = "read_committed"):
        if isolation not in _BEGIN:
            raise ValueError(f"isolation must be one of {', '.join(_BEGIN)}, got {isolation!r}")
        self._pool = pool
        self._isolation = isolation
        self.conn: asyncpg.Connection | None = None
        self.committed = False
        self._savepoints = 0

    async def __aenter__(self) -> "UnitOfWork":
        self.conn = await self._pool.acquire()
        try:
            await self.conn.execute(begin_statement(self._isolation))
        except BaseException:
            await self._pool.release(self.conn)
            raise
        return self

    async def commit(self) -> None:
        assert self.conn is not None
        await self.conn.execute("COMMIT")
        self.committed = True

    async def rollback(self) -> None:
        assert self.conn is not None
        if not self.committed:
            await self.conn.execute("ROLLBACK")
            self.committed = True  # finished either way

    @contextlib.asynccontextmanager
    async def savepoint(self):
        """A nested block whose writes are undone alone when it raises (the transaction goes on)."""
        self._savepoints += 1
        name = f"cuty_savepoint_{self._savepoints}"
        await self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            await self.conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
            raise
        await self.conn.execute(f"RELEASE SAVEPOINT {name}")

    async def __aexit__(self, *exc: object) -> None:
        try:
            if not self.committed:
                try:
                    await self.conn.execute("ROLLBACK")
                except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                    log.warning("rollback failed; connection will be discarded", exc_info=True)
        finally:
            await self._pool.release(self.conn)


async def ensure_database(dsn: str) -> None:
    """Create the DSN's database on its server if it does not exist yet."""
    from urllib.parse import urlsplit

    dbname = urlsplit(dsn).path.lstrip("/")
    admin = await asyncpg.connect(with_database(dsn, "postgres"))
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", dbname)
        if not exists:
            try:
                # Identifiers cannot be parameters; the name comes from our config, quoted here.
                await admin.execute('CREATE DATABASE "%s"' % dbname.replace('"', '""'))
            except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                pass  # a replica created it first
    finally:
        await admin.close()


MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# Any fixed 64-bit key; every service uses its own database so one key suffices.
MIGRATION_LOCK_KEY = 0x63757479_6d696772  # "cutymigr"

# Function files are recorded in schema_migrations under this prefix, with their checksum.
FUNCTION_PREFIX = "functions/"


class MigrationError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class MigrationFile:
    """One file of a migrations folder: a versioned migration (`NNNN_name.sql`, applied once, never
    changed) or a function file (`functions/name.sql`, applied again whenever its text changes)."""
    version: str
    path: pathlib.Path

    @property
    def repeatable(self) -> bool:
        return self.version.startswith(FUNCTION_PREFIX)

    def read(self) -> tuple[str, str]:
        sql = self.path.read_text()
        return sql, hashlib.sha256(sql.encode()).hexdigest()


def migration_plan(migrations_dir: str | pathlib.Path, shared: bool = True) -> list[MigrationFile]:
    """The files of `migrations_dir` (and, unless `shared` is false, of SHARED_MIGRATIONS) in the
    order they apply: every function file first (shared ones before the service's, each folder in
    name order), then the versioned migrations in name order.

    Functions come first so that the tables, policies and triggers a versioned migration declares
    can name them; their bodies are checked only after the versioned migrations ran
    (check_function_bodies), so a function may read a table created after it. A function whose
    signature names a table's row type waits until the versioned migrations created it.
    """
    folders = ([SHARED_MIGRATIONS] if shared else []) + [pathlib.Path(migrations_dir)]
    functions = [MigrationFile(FUNCTION_PREFIX + f.stem, f)
                 for folder in folders for f in sorted((folder / "functions").glob("*.sql"))]
    names = [f.version for f in functions]
    if len(set(names)) != len(names):
        raise MigrationError(f"two function files share a name: {sorted(n for n in names if names.count(n) > 1)}")
    versioned = sorted((MigrationFile(f.stem, f) for folder in folders for f in folder.glob("*.sql")),
                       key=lambda m: m.version)
    numbers = [m.version.split("_", 1)[0] for m in versioned]
    if len(set(numbers)) != len(numbers):
        raise MigrationError(f"two migrations share a number: {sorted({n for n in numbers if numbers.count(n) > 1})}")
    return functions + versioned


# A migration waits at most this long for a lock (CUTY_MIGRATION_LOCK_TIMEOUT, seconds) and the whole
# transaction is tried again up to CUTY_MIGRATION_LOCK_ATTEMPTS times: a migration queued behind a
# long transaction on the serving version would otherwise block every query on that table behind it.
DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS = 5.0
DEFAULT_MIGRATION_LOCK_ATTEMPTS = 10
# First line of a migration that must run outside a transaction (CREATE INDEX CONCURRENTLY).
NO_TRANSACTION = "-- cuty:no-transaction"


def _no_transaction(sql: str) -> bool:
    return sql.lstrip().startswith(NO_TRANSACTION)


async def migrate(dsn: str, migrations_dir: str | pathlib.Path, *, create: bool = True,
                  shared: bool = True, lock_timeout: float | None = None, attempts: int | None = None) -> list[str]:
    """Bring the database to the schema of `migrations_dir`: function files whose text changed since
    they were last applied, then versioned migrations not applied yet (migration_plan's order), all
    in one transaction, so a serving replica sees the old schema or the new one, never a mix.

    Each lock is waited for at most `lock_timeout` seconds (CUTY_MIGRATION_LOCK_TIMEOUT, 5); on a
    timeout the transaction rolls back and is tried again, up to `attempts` times
    (CUTY_MIGRATION_LOCK_ATTEMPTS, 10) with a growing pause, so the serving version's queries queue
    behind the migration for at most `lock_timeout` at a time.

    A versioned migration whose first line is `-- cuty:no-transaction` (one statement, e.g. CREATE
    INDEX CONCURRENTLY) runs after that transaction, outside any, each recorded once it succeeded.

    Forward-only: an applied versioned migration whose text changed is an error (add a new one); a
    function file is meant to change, and is applied again. Replicas starting together are
    serialised by a session advisory lock, so each change is applied exactly once.
    Returns the versions applied by this call.
    """
    lock_timeout = env_float("CUTY_MIGRATION_LOCK_TIMEOUT", DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS) \
        if lock_timeout is None else lock_timeout
    attempts = env_int("CUTY_MIGRATION_LOCK_ATTEMPTS", DEFAULT_MIGRATION_LOCK_ATTEMPTS) if attempts is None else attempts
    if create:
        await ensure_database(dsn)
    plan = migration_plan(migrations_dir, shared)
    conn = await asyncpg.connect(dsn)
    applied_now: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            await conn.execute(MIGRATIONS_TABLE)
            done = {r["version"]: r["checksum"] for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")}
            _refuse_foreign_history(done, plan)
            applied_now = await _retrying_on_lock_timeout(
                lambda: _apply_in_one_transaction(conn, plan, done, lock_timeout), attempts, lock_timeout)
            for version in applied_now:
                log.info("migration applied", extra={"version": version, "database": dsn.rsplit("/", 1)[-1]})
            applied_now += await _apply_outside_transactions(conn, plan, done, lock_timeout, attempts, dsn)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    finally:
        await conn.close()
    return applied_now


async def _retrying_on_lock_timeout(run, attempts: int, lock_timeout: float):
    """`await run()`, again after a growing pause (0.5 s doubling, at most 30 s) whenever a lock
    was not granted within lock_timeout; the last attempt's LockNotAvailableError propagates."""
    for attempt in range(1, attempts + 1):
        try:
            return await run()
        except asyncpg.LockNotAvailableError:
            if attempt == attempts:
                raise
            pause = min(30.0, 0.5 * 2 ** (attempt - 1))
            log.warning("migration waited longer than lock_timeout; retrying",
                        extra={"attempt": attempt, "lock_timeout_s": lock_timeout, "pause_s": pause})
            await asyncio.sleep(pause)


async def _apply_in_one_transaction(conn: asyncpg.Connection, plan: list[MigrationFile], done: dict[str, str],
                                    lock_timeout: float) -> list[str]:
    applied_now: list[str] = []
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'")
        await conn.execute("SET LOCAL check_function_bodies = off")
        # A function whose signature names a table's row type (RETURNS TABLE (h holds)) cannot
        # be created before that table, body checks or not: it waits for the versioned ones.
        deferred: list[MigrationFile] = []
        for m in plan:
            sql, checksum = m.read()
            if done.get(m.version) == checksum:
                continue
            if m.version in done and not m.repeatable:
                raise MigrationError(f"migration {m.path.name} was changed after it was applied; add a new migration instead")
            if not m.repeatable and _no_transaction(sql):
                continue  # after this transaction
            if m.repeatable and not await _create_if_types_exist(conn, sql):
                deferred.append(m)
                continue
            await _record(conn, m, checksum, sql=None if m.repeatable else sql)
            applied_now.append(m.version)
        for m in deferred:
            sql, checksum = m.read()
            await _record(conn, m, checksum, sql=sql)
            applied_now.append(m.version)
        # Now that the tables exist, the changed functions are created once more with their
        # bodies checked, so a broken function fails here and not at its first call.
        await conn.execute("SET LOCAL check_function_bodies = on")
        for m in plan:
            if m.repeatable and m.version in applied_now:
                await conn.execute(m.read()[0])
    return applied_now


async def _apply_outside_transactions(conn: asyncpg.Connection, plan: list[MigrationFile], done: dict[str, str],
                                      lock_timeout: float, attempts: int, dsn: str) -> list[str]:
    """The `-- cuty:no-transaction` migrations not applied yet, in order, each on its own, recorded
    once it succeeded. A CREATE INDEX CONCURRENTLY that fails (a lock timeout on every attempt, a
    duplicate key) leaves an INVALID index and its file unrecorded: drop the index (DROP INDEX
    CONCURRENTLY) before the next run (docs/deploy.md, "Schema changes while the old version serves")."""
    applied: list[str] = []
    for m in plan:
        if m.repeatable or m.version in done:
            continue
        sql, checksum = m.read()
        if not _no_transaction(sql):
            continue
        async def run(sql: str = sql) -> None:
            await conn.execute(f"SET lock_timeout = '{int(lock_timeout * 1000)}ms'")
            try:
                await conn.execute(sql)
            finally:
                await conn.execute("RESET lock_timeout")

        await _retrying_on_lock_timeout(run, attempts, lock_timeout)
        await _record(conn, m, checksum, sql=None)
        applied.append(m.version)
        log.info("migration applied", extra={"version": m.version, "database": dsn.rsplit("/", 1)[-1],
                                             "transaction": False})
    return applied


async def _create_if_types_exist(conn: asyncpg.Connection, sql: str) -> bool:
    """Run a function file in a savepoint; False (and nothing done) when a type or table it names
    does not exist yet."""
    try:
        async with conn.transaction():
            await conn.execute(sql)
        return True
    except (asyncpg.UndefinedObjectError, asyncpg.UndefinedTableError):
        return False


async def _record(conn: asyncpg.Connection, m: MigrationFile, checksum: str, *, sql: str | None) -> None:
    """Apply `sql` (unless None: applied already) and record `m` as applied with `checksum`."""
    if sql is not None:
        await conn.execute(sql)
    await conn.execute(
        "INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2) "
        "ON CONFLICT (version) DO UPDATE SET checksum = excluded.checksum, applied_at = clock_timestamp()",
        m.version, checksum)


def _refuse_foreign_history(done: dict[str, str], plan: list[MigrationFile]) -> None:
    """A database migrated before the schema was squashed into its baseline records none of the
    versioned migrations there are now: applying the baseline over it would fail half-way, so say
    what to do instead."""
    versioned = [m.version for m in plan if not m.repeatable]
    recorded = [v for v in done if not v.startswith(FUNCTION_PREFIX)]
    if versioned and recorded and not set(recorded) & set(versioned):
        raise MigrationError(
            f"this database was migrated by an older migration history ({', '.join(sorted(recorded)[:3])}, ...) that the "
            f"baseline {versioned[0]} replaced; recreate it (for `make run`: remove CUTY_DATA_DIR, .cuty by default)")


async def pending_migrations(dsn: str, migrations_dir: str | pathlib.Path, *, shared: bool = True) -> list[str]:
    """Versions of `migrations_dir` not applied yet, function files whose text changed included (a
    service started with migrations left to a Job waits for this to be empty before it serves)."""
    plan = migration_plan(migrations_dir, shared)
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NULL"):
            return [m.version for m in plan]
        done = {r["version"]: r["checksum"] for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")}
    finally:
        await conn.close()
    return [m.version for m in plan if m.version not in done or (m.repeatable and done[m.version] != m.read()[1])]
