"""One grpc.aio channel per service process, and a generic call per route (unary, or
server-streaming for the routes answered as Server-Sent Events).

Calls use `channel.unary_unary(path)` with the request already serialized (app.py transcodes
into bytes, memoised) and, for unary calls, the answer's bytes as they came: the app decodes them
(and reuses the JSON of a read's repeated answer). No generated stub is needed and every annotated
RPC is callable the same way.
Channels are created inside the running event loop (grpc.aio binds them to it), and again when
the gateway's certificate files change (cutylib.tls.CertificateFiles): the old ones are closed once
their calls had cutylib.grpc_client.RETIRE_GRACE_SECONDS to finish.
"""
from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cutylib.grpc_client import RETIRE_GRACE_SECONDS
from cutylib.tls import Transport

from .descriptors import Route

log = logging.getLogger(__name__)


class Backends:
    def __init__(self, addrs: dict[str, str], transport: Transport):
        self.addrs = addrs
        self.transport = transport
        self.channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        self._streams: dict[str, grpc.aio.UnaryStreamMultiCallable] = {}
        self._generation = 0
        self._retiring: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._open()
        for owner, addr in self.addrs.items():
            log.info("backend", extra={"backend": owner, "addr": addr})

    def _open(self) -> None:
        self._generation = self.transport.generation
        for owner, addr in self.addrs.items():
            # Mutual TLS as the gateway; the server must prove it is `owner` whatever the address.
            # Round robin over every address the name resolves to, with keepalive (Transport.channel).
            self.channels[owner] = self.transport.channel(addr, owner, options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ])

    def _renew(self) -> None:
        """New channels (and callables) when the certificate files changed since they were made."""
        if self.transport.generation == self._generation:
            return
        old = list(self.channels.values())
        self._calls.clear()
        self._streams.clear()
        self._open()
        log.info("backend channels renewed with the new certificate", extra={"generation": self._generation})
        for ch in old:
            task = asyncio.get_running_loop().create_task(ch.close(RETIRE_GRACE_SECONDS))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*(ch.close() for ch in self.channels.values()), return_exceptions=True)
        self.channels.clear()
        self._calls.clear()
        self._streams.clear()

    def _callable(self, route: Route) -> grpc.aio.UnaryUnaryMultiCallable:
        self._renew()
        fn = self._calls.get(route.grpc_path)
        if fn is None:
            # Bytes in, bytes out; registered with the channel as generated stubs do (no per-call
            # method-path lookup in gRPC's core).
            fn = self.channels[route.owner].unary_unary(route.grpc_path, _registered_method=True)
            self._calls[route.grpc_path] = fn
        return fn

    async def call(self, route: Route, request: bytes, *, metadata: tuple, timeout: float) -> bytes:
        """The serialized answer of a unary RPC to the serialized `request`."""
        return await self._callable(route)(request, metadata=metadata, timeout=timeout)

    def stream(self, route: Route, request: bytes, *, metadata: tuple,
               timeout: float | None) -> grpc.aio.UnaryStreamCall:
        """A server-streaming call (its messages decoded), started with the serialized `request`
        (the caller reads it and cancels it when done)."""
        self._renew()
        fn = self._streams.get(route.grpc_path)
        if fn is None:
            fn = self.channels[route.owner].unary_stream(route.grpc_path, _registered_method=True,
                                                          response_deserializer=route.output_type.FromString)
            self._streams[route.grpc_path] = fn
        return fn(request, metadata=metadata, timeout=timeout)

    async def health(self, timeout: float) -> dict[str, str]:
        """owner -> SERVING | NOT_SERVING | UNAVAILABLE ... (the overall server status, service "")."""
        async def one(owner: str, ch: grpc.aio.Channel) -> tuple[str, str]:
            try:
                resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
                return owner, health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.aio.AioRpcError as e:
                return owner, e.code().name
        return dict(await asyncio.gather(*(one(o, ch) for o, ch in sorted(self.channels.items()))))
