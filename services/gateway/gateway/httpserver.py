"""The gateway's HTTP/1.1 protocol: uvicorn's httptools protocol, with each answer written at once.

uvicorn writes an answer's head as soon as the application starts it and the body when it comes:
two `write` system calls per answer, two TCP segments and, often, two wake-ups of the client. An
answer's head and body are sent within one turn of the event loop, so the writes of one turn are
joined and written once at the end of the turn. Past capacity the gateway answers thousands of
refusals a second, each a few dozen bytes: a system call and a segment less on each is a large part
of what a refusal costs (`make bench-refusal`, end to end).

Nothing waits longer than the current turn; a close writes what is pending first; flow control is
the transport's own (its buffer is filled at the end of the turn instead of during it).
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _TurnWriter:
    """A transport whose writes within one event-loop turn are written as one."""
    __slots__ = ("_transport", "_pending", "_loop")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = loop

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending = []
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's `http=` protocol class for the gateway (gateway.__main__)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Flow control (pause/resume reading) stays on the real transport (FlowControl above).
        self.transport = _TurnWriter(transport, self.loop)
