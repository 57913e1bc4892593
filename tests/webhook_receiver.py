"""A merchant's webhook endpoint for tests: a real local HTTP server that
verifies Cuty-Signature with the endpoint's secret, deduplicates by Cuty-Event-Id, and can be told
to fail (HTTP 500) the first N requests or to answer slowly. It records every request, and notes
when two requests of one delivery were in flight at the same time (which the lease rules out)."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from payments import signature
from cutylib.testing.procs import wait_for


class Receiver:
    def __init__(self, *, fail_first: int = 0, delay: float = 0.0):
        self.secrets: list[str] = []
        self.fail_first = fail_first
        self.delay = delay
        self.requests: list[dict] = []       # every request, as received
        self.events: dict[str, dict] = {}    # verified, deduplicated by event id
        self.duplicates = 0
        self.rejected = 0
        self.overlaps: list[str] = []        # delivery ids seen twice in flight at once
        self.spans: list[tuple[float, float]] = []  # (start, end) of every request, loop.time()
        self._in_flight: collections.Counter = collections.Counter()
        self._arrived = asyncio.Condition()
        self.server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def _hook(self, request: Request) -> Response:
        started = asyncio.get_running_loop().time()
        body = await request.body()
        delivery = request.headers.get("cuty-delivery-id", "")
        self._in_flight[delivery] += 1
        if self._in_flight[delivery] > 1:
            self.overlaps.append(delivery)
        try:
            self.requests.append({"headers": dict(request.headers), "body": body})
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail_first > 0:
                self.fail_first -= 1
                return Response(status_code=500)
            try:
                signature.verify(request.headers.get("cuty-signature"), body, self.secrets)
            except Exception:  # noqa: BLE001 - any refusal: 400, and the sender retries
                self.rejected += 1
                return Response(status_code=400)
            event = json.loads(body)
            assert event["id"] == request.headers["cuty-event-id"]
            async with self._arrived:
                if event["id"] in self.events:
                    self.duplicates += 1
                else:
                    self.events[event["id"]] = event
                self._arrived.notify_all()
            return Response(status_code=204)
        finally:
            self._in_flight[delivery] -= 1
            self.spans.append((started, asyncio.get_running_loop().time()))

    async def until(self, predicate, timeout: float = 20.0) -> None:
        """Wait until predicate(self.events) is true."""
        async def wait():
            async with self._arrived:
                await self._arrived.wait_for(lambda: predicate(self.events))
        await asyncio.wait_for(wait(), timeout)

    async def __aenter__(self) -> "Receiver":
        app = Starlette(routes=[Route("/hooks", self._hook, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    lifespan="off"))
        self._task = asyncio.create_task(self.server.serve())
        await wait_for(lambda: self.server.started, timeout=4, interval=0.02, message="the receiver listening")
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None and self._task is not None
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, 5)
