"""Client channels: mutual TLS as this process's identity, default deadlines, the user forwarded.

The defaults are added by wrapping the channel's multicallables, not by a grpc.aio client
interceptor: an intercepted call runs as an extra task with its own call object around the real
one, which cost about a tenth of a cheap call's client CPU (docs/benchmarks.md, "Issue 11, part 4").
"""
from __future__ import annotations

import grpc

from . import deadlines, principal, telemetry
from .identity import ASSERTION_KEY
from .tls import Transport


class _Defaults:
    """Give every call a deadline and forward the current user's signed assertion, unchanged.

    Work done as `system` (the saga) forwards no user: the callee then sees only this service.
    `deadline` is None for streamed answers (a watch lives as long as its caller wants).
    A call made while serving an RPC with a deadline (cutylib.deadlines) gets at most the time that
    RPC has left: min(the call's own timeout or the default, the time left), so the callee stops
    when our caller stops waiting, not seconds later."""

    __slots__ = ("_call", "_deadline", "_declared")

    def __init__(self, call, deadline: float | None, declared: tuple[tuple[str, str], ...]):
        self._call = call
        self._deadline = deadline
        self._declared = declared

    def __call__(self, request, *, timeout=None, metadata=None, **kwargs):
        md = list(metadata or ())
        md.extend(self._declared)
        assertion = principal.current().assertion
        if assertion and not any(k == ASSERTION_KEY for k, _ in md):
            md.append((ASSERTION_KEY, assertion))
        if telemetry.propagating_by_hand() and not any(k == "traceparent" for k, _ in md):
            md.extend(telemetry.inject_metadata())
        if timeout is None:
            timeout = self._deadline
        left = deadlines.remaining()
        if left is not None and (timeout is None or left < timeout):
            timeout = max(left, 0.0)
        return self._call(request, timeout=timeout, metadata=tuple(md), **kwargs)


class Channel:
    """A grpc.aio.Channel whose calls carry the defaults above; anything else is the channel's."""

    def __init__(self, channel: grpc.aio.Channel, deadline: float, transport: Transport):
        self._channel = channel
        self._deadline = deadline
        self._declared = transport.metadata()

    def unary_unary(self, *args, **kwargs):
        return _Defaults(self._channel.unary_unary(*args, **kwargs), self._deadline, self._declared)

    def stream_unary(self, *args, **kwargs):
        return _Defaults(self._channel.stream_unary(*args, **kwargs), self._deadline, self._declared)

    def unary_stream(self, *args, **kwargs):
        return _Defaults(self._channel.unary_stream(*args, **kwargs), None, self._declared)

    def stream_stream(self, *args, **kwargs):
        return _Defaults(self._channel.stream_stream(*args, **kwargs), None, self._declared)

    def __getattr__(self, name):
        return getattr(self._channel, name)

    async def __aenter__(self) -> "Channel":
        return self

    async def __aexit__(self, *exc) -> None:
        await self._channel.close()


def create_channel(addr: str, target: str, transport: Transport, *, deadline_seconds: float = 5.0,
                   options: list[tuple] | None = None) -> Channel:
    """A channel to the service named `target` at `addr`, as `transport`'s identity, whose calls
    with one answer default to `deadline_seconds` (streamed answers have no default deadline)."""
    return Channel(transport.channel(
        addr, target,
        options=[("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.enable_retries", 0),
                 *(options or [])],
    ), deadline_seconds, transport)
