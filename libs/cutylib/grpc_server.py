"""gRPC aio server bootstrap: health, reflection, the error/principal interceptor, graceful stop."""
from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from typing import Awaitable, Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from . import principal, telemetry
from .grpc_errors import status_for_exception
from .grpc_metrics import GrpcMetricsInterceptor

log = logging.getLogger(__name__)


class ErrorAndPrincipalInterceptor(grpc.aio.ServerInterceptor):
    """Sets the caller's principal for the handler and maps escaping domain errors to status codes.

    The single place where exceptions become gRPC statuses, so handlers just raise.
    """

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        caller = principal.from_metadata(handler_call_details.invocation_metadata)

        async def _fail(exc: BaseException, context) -> None:
            status = status_for_exception(exc)
            if status is None:
                log.exception("unhandled error in %s", handler_call_details.method)
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
            else:
                if status.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED):
                    log.warning("%s: %s", handler_call_details.method, status.details)
                await context.abort_with_status(status)

        by_hand = telemetry.propagating_by_hand()
        method, metadata = handler_call_details.method, handler_call_details.invocation_metadata

        def wrap_unary(behavior):
            async def wrapped(request_or_iterator, context):
                token = principal.set_current(caller)
                try:
                    if by_hand:
                        with telemetry.server_span(method, metadata):
                            return await behavior(request_or_iterator, context)
                    return await behavior(request_or_iterator, context)
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    await _fail(exc, context)
                finally:
                    principal._current.reset(token)
            return wrapped

        def wrap_stream(behavior):
            async def wrapped(request_or_iterator, context):
                token = principal.set_current(caller)
                try:
                    result = behavior(request_or_iterator, context)
                    if inspect.isasyncgen(result):
                        async for item in result:
                            yield item
                    else:
                        await result
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:  # noqa: BLE001
                    await _fail(exc, context)
                finally:
                    principal._current.reset(token)
            return wrapped

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                wrap_unary(handler.unary_unary), handler.request_deserializer, handler.response_serializer)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                wrap_unary(handler.stream_unary), handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                wrap_stream(handler.unary_stream), handler.request_deserializer, handler.response_serializer)
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                wrap_stream(handler.stream_stream), handler.request_deserializer, handler.response_serializer)
        return handler


BackgroundTask = Callable[[], Awaitable[None]]


class GrpcServer:
    """A gRPC aio server with health checking, reflection and background workers.

        server = GrpcServer("booking", port)
        booking_pb2_grpc.add_BookingServiceServicer_to_server(servicer, server.server)
        server.add_service_name(booking_pb2.DESCRIPTOR.services_by_name["BookingService"].full_name)
        server.add_background(sweeper.run)
        await server.run_until_signal()
    """

    def __init__(self, name: str, port: int, *, host: str = "0.0.0.0", grace_seconds: float = 5.0,
                 interceptors: Iterable[grpc.aio.ServerInterceptor] = ()):
        self.name = name
        self.grace_seconds = grace_seconds
        self.server = grpc.aio.server(
            interceptors=[GrpcMetricsInterceptor(), ErrorAndPrincipalInterceptor(), *interceptors],
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 * 1024 * 1024)],
        )
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._service_names: list[str] = [health.SERVICE_NAME, reflection.SERVICE_NAME]
        self._background: list[BackgroundTask] = []
        self._tasks: list[asyncio.Task] = []
        self._on_stop: list[Callable[[], Awaitable[None]]] = []

    def add_service_name(self, full_name: str) -> None:
        self._service_names.append(full_name)

    def add_background(self, fn: BackgroundTask) -> None:
        self._background.append(fn)

    def on_stop(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._on_stop.append(fn)

    async def start(self) -> int:
        reflection.enable_server_reflection(self._service_names, self.server)
        await self.server.start()
        for name in self._service_names:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        for fn in self._background:
            self._tasks.append(asyncio.create_task(_supervised(fn), name=f"{self.name}:{getattr(fn, '__qualname__', fn)}"))
        log.info("gRPC server started", extra={"service": self.name, "port": self.port})
        return self.port

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.stop(self.grace_seconds)
        for fn in self._on_stop:
            await fn()
        log.info("gRPC server stopped", extra={"service": self.name})

    async def run_until_signal(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await self.stop()


async def _supervised(fn: BackgroundTask) -> None:
    """Run a background worker forever; a crash is logged and the worker restarted after a pause."""
    while True:
        try:
            await fn()
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("background worker crashed; restarting in 1 s")
            await asyncio.sleep(1.0)
