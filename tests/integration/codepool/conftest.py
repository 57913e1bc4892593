"""Code pool integration fixtures: one migrated database, one in-process gRPC server per session."""
from __future__ import annotations

import hashlib
import logging
import os

import pytest
import pytest_asyncio

from cutylib.config import Settings
from codepool.grpc_api import CALLERS
from cutylib.testing.trust import acting_channel
from cutylib.telemetry import JsonFormatter

from codepool.bootstrap import create_codepool_pool, create_server
from codepool.keys import Keyring
from cuty.codepool.v1 import codepool_pb2_grpc


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.setFormatter(JsonFormatter("tests"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # noqa: BLE001 - a log line that cannot be formatted is still searched raw
            self.lines.append(repr(record.__dict__))


@pytest.fixture(scope="session")
def captured_logs() -> _Capture:
    """Every log record emitted while a code pool test module runs, formatted as the services write them."""
    return _Capture()


@pytest.fixture(scope="module", autouse=True)
def _capture_logs(captured_logs):
    # Attached per module (not per session) so other folders' tests run with their own logging.
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(captured_logs)
    root.setLevel(logging.DEBUG)
    yield
    root.removeHandler(captured_logs)
    root.setLevel(old_level)


# Fixed, so that a database kept between sessions (CUTY_TEST_DSN) still matches the fingerprint the
# service stores at first start (bootstrap.check_hash_key). Test-only; never a real key.
TEST_HASH_KEY = hashlib.sha256(b"cuty codepool tests: hash key").digest()


@pytest.fixture(scope="session")
def keyring() -> Keyring:
    return Keyring(keys={"t1": os.urandom(32)}, active="t1", hash_key=TEST_HASH_KEY)


async def _pool(dsn: str, name: str):
    pool = await create_codepool_pool(dsn, Settings(), min_size=2, max_size=30, application_name=name)
    yield pool
    await pool.close()


@pytest_asyncio.fixture(scope="session")
async def cp_pool(codepool_dsn):
    """The tests' own pool (the superuser: reads and writes past Row-Level Security and triggers)."""
    async for pool in _pool(codepool_dsn, "codepool-tests"):
        yield pool


@pytest_asyncio.fixture(scope="session")
async def cp_service_pool(codepool_service_dsn):
    """The server's pool: the code pool's own database role, as in production."""
    async for pool in _pool(codepool_service_dsn, "codepool-service"):
        yield pool


@pytest_asyncio.fixture(scope="session")
async def cp_server(cp_service_pool, keyring):
    server = await create_server(Settings(), cp_service_pool, keyring=keyring)
    await server.start()
    yield server
    await server.stop()


@pytest_asyncio.fixture(scope="session")
async def channel(cp_server):
    async with acting_channel(f"127.0.0.1:{cp_server.port}", "codepool", CALLERS, deadline_seconds=30) as ch:
        yield ch


@pytest.fixture
def stub(channel) -> codepool_pb2_grpc.CodePoolServiceStub:
    return codepool_pb2_grpc.CodePoolServiceStub(channel)


