"""Client channels: mutual TLS as this process's identity, default deadlines.

The defaults are added by wrapping the channel's multicallables, not by a grpc.aio client
interceptor: an intercepted call runs as an extra task with its own call object around the real
one, which cost about a tenth of a cheap call's client CPU (docs/benchmarks.md, "Issue 11, part 4").

When the process's certificate files change (cutylib.tls.CertificateFiles), the next call opens a
new grpc channel with the new files and the old one is closed once its calls had `RETIRE_GRACE_SECONDS`
to finish: grpc's client credentials are fixed when a channel is made.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from . import deadlines, telemetry
from .tls import Transport

log = logging.getLogger(__name__)
RETIRE_GRACE_SECONDS = 30.0


class _Defaults:
    """Give every call a deadline. No user travels with it: only the gateway brings users, with an
    assertion signed for the one service it calls (cutylib.identity), so a service's onward calls
    are its own (`system`, where the callee grants that RPC to it; docs/security.md).
    `deadline` is None for streamed answers (a watch lives as long as its caller wants).
    A call made while serving an RPC with a deadline (cutylib.deadlines) gets at most the time that
    RPC has left: min(the call's own timeout or the default, the time left), so the callee stops
    when our caller stops waiting, not seconds later.
    The multicallable is made again from the owner's current grpc channel when that was renewed."""

    __slots__ = ("_owner", "_kind", "_args", "_kwargs", "_call", "_generation", "_deadline", "_declared")

    def __init__(self, owner: "Channel", kind: str, args, kwargs, deadline: float | None):
        self._owner, self._kind, self._args, self._kwargs = owner, kind, args, kwargs
        self._generation = owner.generation
        self._call = getattr(owner.current, kind)(*args, **kwargs)
        self._deadline = deadline
        self._declared = owner.declared

    def __call__(self, request, *, timeout=None, metadata=None, **kwargs):
        if self._owner.renew() != self._generation:
            self._generation = self._owner.generation
            self._call = getattr(self._owner.current, self._kind)(*self._args, **self._kwargs)
        md = list(metadata or ())
        md.extend(self._declared)
        if telemetry.propagating_by_hand() and not any(k == "traceparent" for k, _ in md):
            md.extend(telemetry.inject_metadata())
        if timeout is None:
            timeout = self._deadline
        left = deadlines.remaining()
        if left is not None and (timeout is None or left < timeout):
            timeout = max(left, 0.0)
        return self._call(request, timeout=timeout, metadata=tuple(md), **kwargs)


class Channel:
    """A grpc.aio.Channel whose calls carry the defaults above, renewed when the transport's
    certificate files change; anything else is the current channel's."""

    def __init__(self, make, deadline: float, transport: Transport):
        self._make = make
        self._deadline = deadline
        self._transport = transport
        self.declared = transport.metadata()
        self.generation = transport.generation
        self.current: grpc.aio.Channel = make()
        self._retiring: dict[asyncio.Task, grpc.aio.Channel] = {}

    def renew(self) -> int:
        """The generation of the transport's files, after opening a new channel if they changed."""
        generation = self._transport.generation
        if generation != self.generation:
            old, self.current, self.generation = self.current, self._make(), generation
            log.info("channel renewed with the new certificate", extra={"generation": generation})
            task = asyncio.get_running_loop().create_task(old.close(RETIRE_GRACE_SECONDS))
            self._retiring[task] = old
            task.add_done_callback(lambda t: self._retiring.pop(t, None))
        return generation

    def unary_unary(self, *args, **kwargs):
        return _Defaults(self, "unary_unary", args, kwargs, self._deadline)

    def stream_unary(self, *args, **kwargs):
        return _Defaults(self, "stream_unary", args, kwargs, self._deadline)

    def unary_stream(self, *args, **kwargs):
        return _Defaults(self, "unary_stream", args, kwargs, None)

    def stream_stream(self, *args, **kwargs):
        return _Defaults(self, "stream_stream", args, kwargs, None)

    def __getattr__(self, name):
        return getattr(self.current, name)

    async def close(self, grace: float | None = None) -> None:
        old = list(self._retiring.values())
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(self.current.close(grace), *(ch.close(grace) for ch in old), return_exceptions=True)

    async def __aenter__(self) -> "Channel":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def create_channel(addr: str, target: str, transport: Transport, *, deadline_seconds: float = 5.0,
                   options: list[tuple] | None = None) -> Channel:
    """A channel to the service named `target` at `addr`, as `transport`'s identity, whose calls
    with one answer default to `deadline_seconds` (streamed answers have no default deadline)."""
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.enable_retries", 0), *(options or [])]
    return Channel(lambda: transport.channel(addr, target, options=options), deadline_seconds, transport)
