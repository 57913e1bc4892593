"""Session-wide fixtures: one PostgreSQL per test session, each service's database migrated once.

Tests use fresh random ids instead of truncating, so they never depend on each other's rows.
"""
from __future__ import annotations

import asyncio
import atexit
import faulthandler
import os
import pathlib
import shutil
import sys
import tempfile

import asyncpg
import pytest
import pytest_asyncio

from cutylib.config import with_database
from cutylib.db import create_pool, migrate
from cutylib.testing.postgres import service_dsn, start_test_postgres

REPO = pathlib.Path(__file__).resolve().parents[1]

# In-process servers and clients of this session share one development PKI (mutual TLS) and
# gateway signing key, created on first use under this folder; e2e stacks make their own.
os.environ["CUTY_DATA_DIR"] = tempfile.mkdtemp(prefix="cuty-test-data-")
atexit.register(shutil.rmtree, os.environ["CUTY_DATA_DIR"], True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Parallel workers (`make test`, pytest-xdist with --dist loadfile or loadgroup) take a test
    file whole: its module-scoped stacks start once, and its tests may rely on running in order.
    A file marked `spread` (independent, long tests) may be taken apart across workers.
    First among the hooks (tryfirst): xdist's own turns the group marks into the tests' work units
    in the same hook, and on a worker it would otherwise run first (a plugin registered after this
    file), before any mark is there, and make every test a unit of its own."""
    for item in items:
        if item.get_closest_marker("spread") is None:
            item.add_marker(pytest.mark.xdist_group(_group(item.nodeid.split("::")[0])))


# Folders whose files share one database on purpose and run on one worker, in file order: the code
# pool's last file searches every table the folder's earlier files filled for a plaintext code.
TOGETHER = ("tests/integration/codepool/",)


def _group(path: str) -> str:
    return next((folder for folder in TOGETHER if path.startswith(folder)), path)


# Every test runs on the session's one event loop (pyproject: asyncio loop scopes). A task a test
# left running is cancelled when the session ends, and asyncio waits for it without a bound: one
# that does not end hangs the whole run after its last test. The session ends them itself, waits
# this long, names each one it found, and ends the worker (its last test fails) instead of hanging.
LEFTOVER_TASKS_SECONDS = 30


@pytest_asyncio.fixture(scope="session", autouse=True)
async def _no_task_outlives_the_session():
    yield
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    if not left:
        return
    for task in left:
        task.cancel()
    _, pending = await asyncio.wait(left, timeout=LEFTOVER_TASKS_SECONDS)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    lines = [f"[{worker}] {len(left)} task(s) still running after the last test, {len(pending)} of them "
             f"still running {LEFTOVER_TASKS_SECONDS} s after being cancelled:"]
    for task in left:
        frames = task.get_stack(limit=3)
        where = " <- ".join(f"{f.f_code.co_name} ({f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_lineno})"
                            for f in reversed(frames))
        lines.append(f"  {'STUCK ' if task in pending else ''}{task.get_name()}: {task.get_coro()!r} at {where}")
    print("\n".join(lines), file=sys.__stderr__, flush=True)
    if pending:
        faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        os._exit(70)


SERVICE_DATABASES = ("booking", "codepool", "payments")


def _migrate_services(dsn: str) -> None:
    """Every service's database on the server of `dsn`, migrated (in a thread: no event loop here)."""
    import asyncio
    import concurrent.futures

    async def run() -> None:
        for service in SERVICE_DATABASES:
            await migrate(with_database(dsn, f"cuty_{service}"), REPO / "services" / service / "migrations")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run()).result()


@pytest.fixture(scope="session")
def pg(tmp_path_factory):
    """The session's PostgreSQL. Parallel workers (pytest-xdist) each start a copy of one cluster
    that the first of them built and migrated (docs/testing.md); a serial run starts its own."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        server = start_test_postgres()
    else:  # the workers' basetemps are siblings under the run's basetemp
        server = start_test_postgres(tmp_path_factory.getbasetemp().parent / "pg-template", _migrate_services)
    yield server
    server.close()


async def _migrated_into(dsn: str, service: str) -> str:
    await migrate(dsn, REPO / "services" / service / "migrations")
    return dsn


async def _migrated(pg, service: str) -> str:
    return await _migrated_into(with_database(pg.dsn, f"cuty_{service}"), service)


@pytest_asyncio.fixture(scope="session")
async def booking_service_dsn(pg, booking_dsn) -> str:
    return await service_dsn(pg.dsn, "booking", booking_dsn)


@pytest_asyncio.fixture(scope="session")
async def codepool_service_dsn(pg, codepool_dsn) -> str:
    return await service_dsn(pg.dsn, "codepool", codepool_dsn)


@pytest_asyncio.fixture(scope="session")
async def payments_service_dsn(pg, payments_dsn) -> str:
    return await service_dsn(pg.dsn, "payments", payments_dsn)


@pytest_asyncio.fixture(scope="session")
async def booking_dsn(pg) -> str:
    return await _migrated(pg, "booking")


@pytest_asyncio.fixture(scope="session")
async def codepool_dsn(pg) -> str:
    return await _migrated(pg, "codepool")


@pytest_asyncio.fixture(scope="session")
async def payments_dsn(pg) -> str:
    return await _migrated(pg, "payments")


@pytest_asyncio.fixture
async def scratch_db(pg):
    """A fresh empty database for tests of the shared libs (migrations, unit of work)."""
    import uuid

    name = "scratch_" + uuid.uuid4().hex[:12]
    admin = await asyncpg.connect(pg.dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    yield with_database(pg.dsn, name)
    admin = await asyncpg.connect(pg.dsn)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest_asyncio.fixture
async def own_database(scratch_db):
    """One service's database of the test's own, migrated (`dsn = await own_database("payments")`),
    dropped after: for what the session's shared databases, with every other test's rows in them,
    would blur (a plan's pages, a gauge's count)."""
    return lambda service: _migrated_into(scratch_db, service)


@pytest_asyncio.fixture
async def scratch_pool(scratch_db):
    pool = await create_pool(scratch_db, min_size=1, max_size=10)
    yield pool
    await pool.close()
