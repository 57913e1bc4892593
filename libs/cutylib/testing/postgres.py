"""The test suite's PostgreSQL, one per test session: CUTY_TEST_DSN when set; else as CUTY_TEST_PG
says: `local` (the default), a throwaway cluster from the local server binaries; `container`, a
testcontainers PostgreSQL in Docker. Both get the same settings (cutylib.pgcluster.server_settings:
the connection limit, no fsync, no synchronous commit, no full-page writes). The choice is explicit:
`container` without a Docker engine fails with a message, it never falls back to the other."""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ..pgcluster import INSTALL_HINT, LocalCluster, PostgresUnavailable, server_settings

CHOICE = "CUTY_TEST_PG"
LOCAL, CONTAINER = "local", "container"
# Every suite's pools at once (tests/conftest.py and the in-process servers) stay under it.
MAX_CONNECTIONS = 600
IMAGE = "postgres:15"  # the major version of the local binaries (CUTY_PG_BIN)


@dataclass
class TestPostgres:
    dsn: str
    cluster: LocalCluster | None = None  # set when we own the server (fault tests may stop it)
    container: object | None = None
    workdir: str | None = None  # the temporary folder holding the cluster, its socket and log

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.destroy()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.container is not None:
            self.container.stop()


def choice() -> str:
    """CUTY_TEST_PG: `local` (unset or empty too) or `container`."""
    value = os.environ.get(CHOICE, "").strip().lower() or LOCAL
    if value not in (LOCAL, CONTAINER):
        raise ValueError(f"{CHOICE} must be {LOCAL} or {CONTAINER}, got {value!r}")
    return value


def container_command(max_connections: int = MAX_CONNECTIONS) -> list[str]:
    """The container's command: the server with the local cluster's settings as `-c` flags."""
    return ["postgres", *(arg for setting in server_settings(max_connections, fast_unsafe=True)
                          for arg in ("-c", setting))]


def _docker_engine():
    """A client of the Docker engine, or PostgresUnavailable saying why there is none."""
    try:
        import docker  # installed with testcontainers

        client = docker.from_env(timeout=2)
        client.ping()
        return client
    except Exception as e:  # noqa: BLE001 - no engine, no socket, no permission: all say the same
        raise PostgresUnavailable(
            f"{CHOICE}={CONTAINER} needs a Docker engine, and none answers ({type(e).__name__}: {e}); "
            f"start one (DOCKER_HOST), or run with {CHOICE}={LOCAL} for a throwaway local cluster") from None


def _start_container() -> TestPostgres:
    _docker_engine()
    from testcontainers.community.postgres import PostgresContainer

    # The image's /dev/shm (64 MB) is too small for shared_buffers and 600 connections' dynamic memory.
    c = PostgresContainer(IMAGE, driver=None, shm_size="512m").with_command(container_command())
    c.start()
    return TestPostgres(dsn=c.get_connection_url(), container=c)


def _start_local() -> TestPostgres:
    try:
        base = tempfile.mkdtemp(prefix="cuty-test-pg-")
        cluster = LocalCluster(os.path.join(base, "data"), fast_unsafe=True, max_connections=MAX_CONNECTIONS)
        cluster.start()
        return TestPostgres(dsn=cluster.dsn, cluster=cluster, workdir=base)
    except PostgresUnavailable as e:
        raise PostgresUnavailable(f"no PostgreSQL for tests: {e}\n{INSTALL_HINT}") from e


def start_test_postgres(template: "os.PathLike | None" = None, prepare=None) -> TestPostgres:
    """The server, with the services' own database roles on it (`service_roles`).

    `template` (a folder shared by parallel test workers) and `prepare(dsn)` (what every worker's
    server needs, e.g. the services' migrated databases): with a local cluster, the first worker
    to come builds a stopped cluster there (initdb, the roles, `prepare`) under a file lock, and
    every worker starts a copy of it in its own folder, on its own port. A copy of the data folder
    takes a fraction of initdb and migrations, which otherwise every worker would repeat at once."""
    if template is not None and not os.environ.get("CUTY_TEST_DSN") and choice() == LOCAL:
        return _start_from_template(pathlib.Path(template), prepare)
    server = _start_test_postgres()
    service_roles(server.dsn)
    return server


def _start_from_template(template: pathlib.Path, prepare) -> TestPostgres:
    template.mkdir(parents=True, exist_ok=True)
    with open(template / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, a crashed builder too
        if not (template / "ready").exists():
            cluster = LocalCluster(template / "data", fast_unsafe=True, max_connections=MAX_CONNECTIONS)
            try:
                cluster.start()
                service_roles(cluster.dsn)
                if prepare is not None:
                    prepare(cluster.dsn)
            except PostgresUnavailable as e:
                raise PostgresUnavailable(f"no PostgreSQL for tests: {e}\n{INSTALL_HINT}") from e
            finally:
                cluster.stop("fast")  # a clean shutdown: the copies start without recovery
            (template / "ready").touch()
    base = tempfile.mkdtemp(prefix="cuty-test-pg-")
    # cp -a keeps the postgres user's ownership and the 0700 mode the server insists on.
    subprocess.run(["cp", "-a", str(template / "data"), os.path.join(base, "data")], check=True)
    cluster = LocalCluster(os.path.join(base, "data"), fast_unsafe=True, max_connections=MAX_CONNECTIONS)
    cluster.start()
    return TestPostgres(dsn=cluster.dsn, cluster=cluster, workdir=base)


def service_roles(admin_dsn: str) -> None:
    """Create the login role of each service on the server (they connect as it; docs/security.md,
    "Database roles"); callable with or without an event loop running."""
    import asyncio
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, ensure_service_roles(admin_dsn)).result()


async def ensure_service_roles(admin_dsn: str) -> None:
    """`service_roles`, from a running event loop."""
    from ..config import SERVICES, WEBHOOKS_OUT_DB_ROLE, db_role_for
    from ..db import ensure_service_role

    if os.environ.get("CUTY_TEST_DB_ROLE", "service") == "owner":
        return
    for role in [db_role_for(s) for s in SERVICES] + [WEBHOOKS_OUT_DB_ROLE]:
        await ensure_service_role(admin_dsn, role)


def _start_test_postgres() -> TestPostgres:
    dsn = os.environ.get("CUTY_TEST_DSN")
    if dsn:
        return TestPostgres(dsn=dsn)
    return _start_container() if choice() == CONTAINER else _start_local()


@contextlib.asynccontextmanager
async def owner_connection(dsn: str):
    """A connection of its own to `dsn` (a test's reads and writes as the superuser), closed after."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def service_dsn(admin_dsn: str, service: str, dsn: str) -> str:
    """`dsn` (a migrated database of `service`) as the service's own role, created on the server
    of `admin_dsn` (docs/security.md, "Database roles"): the services under test connect as in
    production, with a role that owns nothing and is bound by Row-Level Security, while the tests'
    own reads and the migrations use the superuser. CUTY_TEST_DB_ROLE=owner connects the services
    as the superuser too (to tell a privilege problem from another one)."""
    from ..config import db_role_for, with_user
    from ..db import ensure_service_role

    if os.environ.get("CUTY_TEST_DB_ROLE", "service") == "owner":
        return dsn
    await ensure_service_role(admin_dsn, db_role_for(service))
    return with_user(dsn, db_role_for(service))


async def migrate_before(dsn: str, migrations_dir, version: str, workdir) -> list[str]:
    """Migrate `dsn` with the migrations of `migrations_dir` whose name sorts before `version` (the
    database as it was before that migration, for tests of a migration's backfill); `workdir` is a
    scratch folder (pytest's tmp_path). Returns the versions applied."""
    import pathlib

    from ..db import migrate

    older = pathlib.Path(workdir) / f"migrations-before-{version}"
    older.mkdir()
    for f in sorted(pathlib.Path(migrations_dir).glob("*.sql")):
        if f.name < version:
            shutil.copy(f, older / f.name)
    if (pathlib.Path(migrations_dir) / "functions").is_dir():  # the functions as they are now
        shutil.copytree(pathlib.Path(migrations_dir) / "functions", older / "functions")
    return await migrate(dsn, older)
