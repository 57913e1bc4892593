"""Fixtures: one simulator process and one webhook receiver for the session."""

import time

import httpx
import pytest
import pytest_asyncio

from pspsim.server import BackgroundServer
from pspsim_harness import Receiver, Sim, SimProcess


@pytest.fixture(scope="session")
def receiver():
    rec = Receiver()
    with BackgroundServer.for_app(rec.app) as server:
        rec.url = f"{server.url}/webhooks"
        yield rec


@pytest.fixture(scope="session")
def sim_process(receiver, tmp_path_factory):
    proc = SimProcess(tmp_path_factory.mktemp("pspsim") / "pspsim.log", CUTY_PSP_WEBHOOK_URL=receiver.url)
    yield proc
    code = proc.terminate()
    assert code == 0, f"simulator exited with {code} on SIGTERM"


@pytest_asyncio.fixture(scope="session")
async def http():
    async with httpx.AsyncClient(timeout=5.0) as client:
        yield client


@pytest.fixture
def sim(sim_process, http) -> Sim:
    return Sim(sim_process.url, http)


@pytest.fixture
def new_key(request):
    counter = iter(range(1_000_000))
    return lambda: f"{request.node.name}-{time.time_ns()}-{next(counter)}"
