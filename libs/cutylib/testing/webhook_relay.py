"""A test stand-in for the gateway's one PSP route: POST /v1/psp/webhooks -> PaymentService.HandlePspWebhook.

It passes the raw body and the Cuty-Signature header through unchanged, as the gateway does, so
payments tests can run with real PSP webhooks before (or without) the gateway process.
"""
from __future__ import annotations

import asyncio
import itertools

import grpc
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cuty.payments.v1 import payments_pb2, payments_pb2_grpc

from ..pgcluster import free_port
from .trust import channel_as

_HTTP = {
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
}


class WebhookRelay:
    def __init__(self, payments_addrs: list[str], port: int | None = None, pki=None, secure: bool = True):
        self._pki, self._secure = pki, secure
        self.port = port or free_port()
        self._addrs = payments_addrs
        self._channels: list[grpc.aio.Channel] = []
        self._rr = itertools.count()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/psp/webhooks"

    async def _handle(self, request: Request) -> JSONResponse:
        body = await request.body()
        md = (("cuty-signature", request.headers.get("cuty-signature", "")),)
        ch = self._channels[next(self._rr) % len(self._channels)]
        try:
            resp = await payments_pb2_grpc.PaymentServiceStub(ch).HandlePspWebhook(
                payments_pb2.PspWebhookRequest(payload=body), metadata=md, timeout=10)
        except grpc.aio.AioRpcError as e:
            return JSONResponse({"title": e.details(), "status": _HTTP.get(e.code(), 503)},
                                status_code=_HTTP.get(e.code(), 503))
        return JSONResponse({"result": resp.result})

    async def start(self) -> "WebhookRelay":
        # It stands where the gateway stands, so it calls with the gateway's certificate.
        self._channels = [channel_as("gateway", a, "payments", pki=self._pki, secure=self._secure)
                          for a in self._addrs]
        app = Starlette(routes=[Route("/v1/psp/webhooks", self._handle, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                     lifespan="off"))
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.02)
        return self

    async def stop(self) -> None:
        if self._server:
            self._server.should_exit = True
            await self._task
        for ch in self._channels:
            await ch.close()
