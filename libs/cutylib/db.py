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

from . import backoff, deadlines, principal
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
# ALL_MERCHANTS sees every merchant, a merchant id that merchant's rows, unset or '' nothing (fail
# closed). Every path says which it is (docs/tenancy.md, "Who sets the merchant"): a pool declares
# the scope of the service's own paths (`create_pool(merchant=ALL_MERCHANTS)`), a caller bound to a
# merchant (staff, admin) is narrowed to it, whatever pool or unit of work its statements run in.
MERCHANT_SETTING = "cuty.merchant"
ALL_MERCHANTS = "*"

# Statements that set the merchant themselves (a function declared `SET cuty.merchant = '*'`): a pool
# whose sessions do not have ALL_MERCHANTS already runs them as they are, with no transaction of its
# own around them (HoldSlot's and ReserveCodes' one round trip). See `sets_its_merchant`.
_SETS_ITS_MERCHANT: set[str] = set()

# Migrations every service database shares (tenancy functions), applied with the service's own.
SHARED_MIGRATIONS = pathlib.Path(__file__).parent / "migrations"

# How long a request waits for a pooled connection (CUTY_DB_ACQUIRE_TIMEOUT_SECONDS).
DEFAULT_ACQUIRE_TIMEOUT_SECONDS = 5.0
# How long closing a pool waits for its connections to come back and say goodbye before it cuts
# them. asyncpg's own close has no bound: a connection whose statement was cancelled just as it
# finished waits for a cancel acknowledgement that never comes, and the close with it, for ever.
CLOSE_GRACE_SECONDS = 10.0
# A pool statement that lost a deadlock or serialization failure runs again, at most this many times
# in all, after a jittered pause of about CONFLICT_BACKOFF_SECONDS (doubling).
CONFLICT_ATTEMPTS = 3
CONFLICT_BACKOFF_SECONDS = 0.005


def sets_its_merchant(sql: str) -> str:
    """Declare that `sql` sets `cuty.merchant` for its own duration (it calls a function declared
    with `SET cuty.merchant = '*'`), so a pool runs it for a caller of every merchant as it is.
    Returns `sql`, for `TAKE_HOLD = sets_its_merchant("SELECT ... FROM booking_take_hold(...)")`."""
    _SETS_ITS_MERCHANT.add(sql)
    return sql


def sql_literal(value: str) -> str:
    """`value` as an SQL string literal (standard_conforming_strings, the server default)."""
    if "\x00" in value:
        raise ValueError("an SQL literal holds no NUL character")
    return "'" + value.replace("'", "''") + "'"


def scope_statement(merchant: str) -> str:
    """The statement that confines the current transaction to `merchant` (SET LOCAL)."""
    return f"SELECT set_config('{MERCHANT_SETTING}', {sql_literal(merchant)}, true);"


def caller_scope(default: str | None) -> str | None:
    """The `cuty.merchant` the current caller's statements run with: its merchant for a caller
    bound to one (staff, admin; refused without one), else `default` (the pool's declaration)."""
    merchant = principal.current().merchant()
    return default if merchant is None else merchant


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 20,
                      acquire_timeout: float | None = DEFAULT_ACQUIRE_TIMEOUT_SECONDS,
                      merchant: str | None = None, merchant_at_connect: bool = True, reporting_max_size: int = 0,
                      **kwargs: Any) -> asyncpg.Pool:
    """A pool whose sessions run in UTC with JSON codecs and no per-release reset round trip, and
    whose acquire gives up after `acquire_timeout` seconds (None: waits for ever).

    `merchant`: whose rows the statements of callers not bound to a merchant see (ALL_MERCHANTS for
    a service's own pool; None: nobody's, the database role's default). With `merchant_at_connect`
    the sessions get it once, as a startup parameter (no cost per statement; a direct connection
    only: PgBouncer in transaction mode refuses unknown startup parameters); without, each unit of
    work sends it with its BEGIN, and a single statement runs in a transaction that does, unless it
    sets the merchant itself (`sets_its_merchant`).

    `reporting_max_size` > 0: a second pool of that size, the same in every other way and closed
    with this one, for reporting reads (`reports(pool)`: lists, a salon's agenda). A burst of
    reports then waits for its own few connections and never takes the ones a purchase needs."""
    reporting = None
    if reporting_max_size > 0:
        app = kwargs.get("application_name", "cuty")
        reporting = await create_pool(dsn, min_size=0, max_size=reporting_max_size, acquire_timeout=acquire_timeout,
                                      merchant=merchant, merchant_at_connect=merchant_at_connect,
                                      **{**kwargs, "application_name": f"{app}-reports"})
    server_settings = {"timezone": "UTC", "application_name": kwargs.pop("application_name", "cuty")}
    if merchant is not None and merchant_at_connect:
        server_settings[MERCHANT_SETTING] = merchant
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
    pool.merchant = merchant
    pool.session_merchant = server_settings.get(MERCHANT_SETTING)
    pool.reporting = reporting
    return await pool


def reports(pool: asyncpg.Pool) -> asyncpg.Pool:
    """The pool reporting reads use: `pool`'s own reporting pool, else `pool` itself."""
    return getattr(pool, "reporting", None) or pool


class BoundedPool(asyncpg.Pool):
    """A pool whose acquire, unless given its own timeout, waits at most `acquire_timeout` seconds
   : with every connection busy (slow queries, stalled streams) a request fails
    fast with TimeoutError, which the gRPC error mapping answers UNAVAILABLE (retryable), instead of
    queueing without end. The pool's fetch/execute helpers and UnitOfWork all acquire through it.

    Inside an RPC with a deadline (cutylib.deadlines) the wait is also cut at that deadline less a
    margin: a request whose deadline is (nearly) spent fails at once with DeadlineExceeded, without
    taking a connection, and one whose deadline passes while it waits gives up then, also with
    DeadlineExceeded (DEADLINE_EXCEEDED), rather than holding a place in the queue for a caller
    that is gone.

    Its fetch/execute helpers also run each statement for the right merchant (`caller_scope`): as
    it is when the session has that setting already (or the statement sets it itself), else in a
    transaction of its own that sets it with its BEGIN (two round trips more: paths of staff and
    admins, and the service's own paths behind a transaction pooler)."""

    __slots__ = ("acquire_timeout", "merchant", "session_merchant", "reporting")

    async def close(self, grace: float = CLOSE_GRACE_SECONDS) -> None:
        """Close gracefully within `grace` seconds, then terminate what is left (asyncpg's close,
        cancelled, terminates the pool itself). The reporting pool closes at the same time, within
        the same grace."""
        async def own() -> None:
            try:
                await asyncio.wait_for(super(BoundedPool, self).close(), grace)
            except asyncio.TimeoutError:
                log.warning("database pool not closed within its grace; connections cut", extra={"grace_s": grace})

        reporting = getattr(self, "reporting", None)
        results = await asyncio.gather(own(), *([reporting.close(grace)] if reporting is not None else []),
                                       return_exceptions=True)
        for error in results:
            if isinstance(error, BaseException):
                raise error

    def terminate(self) -> None:
        super().terminate()
        if getattr(self, "reporting", None) is not None:
            self.reporting.terminate()

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

    def _scope_for(self, query: str) -> str | None:
        """The merchant `query` must be wrapped in a transaction for, or None to run it as it is."""
        want = caller_scope(getattr(self, "merchant", None))
        if want is None or want == getattr(self, "session_merchant", None):
            return None
        if want == ALL_MERCHANTS and query in _SETS_ITS_MERCHANT:
            return None
        return want

    async def _run(self, method: str, query: str, args: tuple, kwargs: dict):
        # The statement is its own transaction: a deadlock or serialization failure rolled all of
        # it back, so running it again is what the caller's retry would do, a round trip sooner.
        # Bounded (CONFLICT_ATTEMPTS, with jitter so the two sides do not meet again in step, and
        # within the call's deadline); the last failure goes up as ABORTED (cutylib.grpc_errors).
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return await self._run_once(method, query, args, kwargs)
            except (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError) as exc:
                pause = backoff.equal_jitter(attempt, CONFLICT_BACKOFF_SECONDS, CONFLICT_BACKOFF_SECONDS * 4)
                left = deadlines.remaining()
                if attempt == CONFLICT_ATTEMPTS or (left is not None and left - pause <= deadlines.MARGIN_SECONDS):
                    raise
                log.info("statement ran again after a transaction conflict",
                         extra={"error_type": type(exc).__name__, "attempt": attempt})
                await asyncio.sleep(pause)

    async def _run_once(self, method: str, query: str, args: tuple, kwargs: dict):
        merchant = self._scope_for(query)
        if merchant is None:
            async with self.acquire() as con:
                return await getattr(con, method)(query, *args, **kwargs)
        async with UnitOfWork(self, merchant=merchant) as uow:
            result = await getattr(uow.conn, method)(query, *args, **kwargs)
            await uow.commit()
            return result

    async def fetch(self, query, *args, timeout=None, record_class=None) -> list:
        return await self._run("fetch", query, args, {"timeout": timeout, "record_class": record_class})

    async def fetchrow(self, query, *args, timeout=None, record_class=None):
        return await self._run("fetchrow", query, args, {"timeout": timeout, "record_class": record_class})

    async def fetchval(self, query, *args, column=0, timeout=None):
        return await self._run("fetchval", query, args, {"column": column, "timeout": timeout})

    async def execute(self, query: str, *args, timeout: float | None = None) -> str:
        return await self._run("execute", query, args, {"timeout": timeout})

    async def executemany(self, command: str, args, *, timeout: float | None = None):
        return await self._run("executemany", command, (args,), {"timeout": timeout})



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


_CALLER = object()  # UnitOfWork's default: the merchant of the current caller, else the pool's


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

    `merchant`: whose rows the transaction sees (`cuty.merchant`, sent with its BEGIN); by default
    the current caller's merchant for a caller bound to one, else the pool's declaration (nothing is
    sent when the pool's sessions have that setting already).
    """

    def __init__(self, pool: asyncpg.Pool, *, isolation: str = "read_committed", merchant: Any = _CALLER):
        if isolation not in _BEGIN:
            raise ValueError(f"isolation must be one of {', '.join(_BEGIN)}, got {isolation!r}")
        self._pool = pool
        self._isolation = isolation
        if merchant is _CALLER:
            merchant = caller_scope(getattr(pool, "merchant", None))
        self._merchant = None if merchant == getattr(pool, "session_merchant", None) else merchant
        self.conn: asyncpg.Connection | None = None
        self.committed = False
        self._savepoints = 0

    async def __aenter__(self) -> "UnitOfWork":
        self.conn = await self._pool.acquire()
        try:
            begin = begin_statement(self._isolation)
            if self._merchant is not None:  # whose rows it sees, in BEGIN's own message
                begin = f"{begin}; {scope_statement(self._merchant)}"
            await self.conn.execute(begin)
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


# The service role's own statement timeout (the database's default, 0003_service_role.sql, is longer):
# a request never waits on one statement longer than this; the sweepers' and imports' batches are
# sized to stay well under it.
SERVICE_STATEMENT_TIMEOUT = "15s"


async def ensure_service_role(admin_dsn: str, role: str, *, password: str | None = None,
                              statement_timeout: str = SERVICE_STATEMENT_TIMEOUT) -> None:
    """Create (or bring in line) the login role a service connects as, on the server of `admin_dsn`
    (a role that may create roles: the tests' and `make run`'s superuser). It owns nothing and
    cannot bypass Row-Level Security; its sessions start with no merchant (`cuty.merchant` '':
    no rows until a path says whose) and a statement timeout. The grants come from the service's
    migrations (0003_service_role.sql). In Kubernetes, CloudNativePG's managed roles do this."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        # Identifiers cannot be parameters: `role` comes from cutylib.config.db_role_for.
        if not role.replace("_", "").isalnum():
            raise ValueError(f"not a role name: {role!r}")
        attributes = "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION"
        exists = await conn.fetchval("SELECT true FROM pg_roles WHERE rolname = $1", role)
        try:
            await conn.execute(f"{'ALTER' if exists else 'CREATE'} ROLE {role} {attributes}")
        except asyncpg.DuplicateObjectError:  # another process created it first
            await conn.execute(f"ALTER ROLE {role} {attributes}")
        if password is not None:
            await conn.execute(f"ALTER ROLE {role} PASSWORD {sql_literal(password)}")
        await conn.execute(f"ALTER ROLE {role} SET {MERCHANT_SETTING} = ''")
        await conn.execute(f"ALTER ROLE {role} SET statement_timeout = {sql_literal(statement_timeout)}")
    finally:
        await conn.close()


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
# A dropped function that older numbered migrations still name (a trigger the baseline declares):
# `functions/retired/<name>.sql` defines it for them on a database they have not reached yet. It is
# applied once, before the numbered migrations, recorded under this prefix and never changed (like a
# numbered migration); the numbered migration that drops the function comes after them, so no
# database keeps it.
RETIRED_PREFIX = "retired/"


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
    name order), then the retired functions (RETIRED_PREFIX), then the versioned migrations in name
    order.

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
    retired = [MigrationFile(RETIRED_PREFIX + f.stem, f)
               for folder in folders for f in sorted((folder / "functions" / "retired").glob("*.sql"))]
    versioned = sorted((MigrationFile(f.stem, f) for folder in folders for f in folder.glob("*.sql")),
                       key=lambda m: m.version)
    numbers = [m.version.split("_", 1)[0] for m in versioned]
    if len(set(numbers)) != len(numbers):
        raise MigrationError(f"two migrations share a number: {sorted({n for n in numbers if numbers.count(n) > 1})}")
    return functions + retired + versioned


# A migration waits at most this long for a lock (CUTY_MIGRATION_LOCK_TIMEOUT, seconds) and the whole
# transaction is tried again up to CUTY_MIGRATION_LOCK_ATTEMPTS times: a migration queued behind a
# long transaction on the serving version would otherwise block every query on that table behind it.
DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS = 5.0
DEFAULT_MIGRATION_LOCK_ATTEMPTS = 10
# A migration may rewrite a large table or build an index: the roles' statement timeouts are for
# requests and people, so the migration's session has a bound of its own
# (CUTY_MIGRATION_STATEMENT_TIMEOUT, seconds; the migrate Jobs' activeDeadlineSeconds is the same hour).
DEFAULT_MIGRATION_STATEMENT_TIMEOUT_SECONDS = 3600.0
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
        bound = env_float("CUTY_MIGRATION_STATEMENT_TIMEOUT", DEFAULT_MIGRATION_STATEMENT_TIMEOUT_SECONDS)
        await conn.execute(f"SET statement_timeout = '{max(1, int(bound * 1000))}ms'")
        await _take_migration_lock(conn, bound)
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


async def _take_migration_lock(conn: asyncpg.Connection, bound: float) -> None:
    """The session advisory lock that serialises replicas migrating together, taken by polling with
    pg_try_advisory_lock rather than waiting in pg_advisory_lock: a statement waiting for the lock
    holds a snapshot, and the holder's CREATE INDEX CONCURRENTLY waits for every older snapshot to
    end, so two replicas starting together would deadlock. Waits at most `bound` seconds."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + bound
    pause = 0.05
    while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_KEY):
        if loop.time() >= give_up:
            raise MigrationError(f"another migration held the migration lock for more than {bound:.0f} s")
        await asyncio.sleep(pause)
        pause = min(1.0, pause * 2)


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
    versioned = [m.version for m in plan if not m.repeatable and not m.version.startswith(RETIRED_PREFIX)]
    recorded = [v for v in done if not v.startswith((FUNCTION_PREFIX, RETIRED_PREFIX))]
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
