import asyncio
import json
import time
from collections.abc import Callable

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from pspsim.psp import Psp
from pspsim.settings import Settings
from pspsim.webhooks import WebhookDispatcher

SECRET = "whsec_unit"


async def _wait_for(predicate: Callable[[], object], timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.fixture
def wait_for():
    return _wait_for


class Hook:
    """A webhook receiver on a local HTTP server (aiohttp's test server): records deliveries,
    answers ``status_for``."""

    def __init__(self):
        self.deliveries: list[dict] = []
        self.status_for: Callable[[dict, int], int] = lambda event, attempt: 200
        self._attempts: dict[str, int] = {}

    async def handler(self, request: web.Request) -> web.Response:
        body = await request.read()
        event = json.loads(body)
        n = self._attempts[event["id"]] = self._attempts.get(event["id"], 0) + 1
        status = self.status_for(event, n)
        self.deliveries.append({"event": event, "body": body, "signature": request.headers["Cuty-Signature"],
                                "status": status, "at": time.monotonic()})
        return web.Response(status=status)

    def acked(self, object_id: str | None = None) -> list[dict]:
        return [d["event"] for d in self.deliveries
                if 200 <= d["status"] < 300 and object_id in (None, d["event"]["data"]["object"]["id"])]


@pytest_asyncio.fixture
async def make_psp():
    created: list[Psp] = []

    async def make(**overrides) -> tuple[Psp, Hook]:
        base = dict(webhook_secrets=(SECRET,), webhook_delay_ms=0, webhook_retry_base_seconds=0.005,
                    webhook_retry_cap_seconds=0.02, sync_timeout_delay_seconds=0.05, settle_delay_ms=10,
                    port=8090)
        hook = Hook()
        app = web.Application()
        app.router.add_post("/webhooks", hook.handler)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        settings = Settings(**{**base, "webhook_url": str(server.make_url("/webhooks")), **overrides})
        psp = Psp(settings, WebhookDispatcher(settings))
        await psp.start()
        created.append(psp)
        return psp, hook

    servers: list[TestServer] = []
    yield make
    for psp in created:
        await psp.aclose()
    for server in servers:
        await server.close()
