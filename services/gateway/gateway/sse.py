"""Server-streaming RPCs as Server-Sent Events (`GET /v1/checkouts/{id}:watch`).

One mechanism for any server-streaming route:

1. The call is started with the same checks, metadata and request as a unary route (app.py).
2. Before the response head, the gateway waits for the backend's initial metadata: a backend
   sends it (`cuty-stream: open`) once it has accepted the call, and refuses a call with a status
   and no message (trailers only). A refusal is an RFC 9457 problem like every route's (404, 429...).
3. Then `text/event-stream` through starlette's StreamingResponse: each message as
   `id: <its id>\\nevent: <its type>\\ndata: <JSON of its resource>\\n\\n` (the resource: the
   message's one field of a `cuty.*` message type; without one, the whole message), and a
   comment line `: keep-alive` after every CUTY_SSE_HEARTBEAT_SECONDS of silence, so proxies keep
   the connection. A failure after the head is one `event: error` with the problem as data.
4. When the client goes away (starlette cancels the body) or the stream ends, the gRPC call is
   cancelled: the backend's stream (and its place under the per-user cap) is freed at once.
5. A stream lives no longer than the token that opened it is accepted (`expires_in`): then one
   `event: error` with a 401 `token-expired` problem, and the stream ends. A token is checked
   once, when the stream opens; without this, a token revoked by expiry would keep watching.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from . import problems
from .transcode import dumps, to_dict, to_json

STREAM_OPEN = ("cuty-stream", "open")
MEDIA_TYPE = "text/event-stream"
KEEP_ALIVE = b": keep-alive\n\n"


async def opened(call: grpc.aio.UnaryStreamCall, *, service: str, deadline: float) -> Message | None:
    """Wait until the backend accepted the call; returns a first message if it sent one instead
    of its initial metadata. A refusal raises the route's Problem (nothing has been sent yet)."""
    try:
        md = await call.initial_metadata()
        if md is not None and STREAM_OPEN in tuple(md):
            return None
        first = await call.read()  # a refused call raises its status here
        return None if first is grpc.aio.EOF else first
    except grpc.aio.AioRpcError as e:
        call.cancel()
        raise problems.from_rpc_error(e, service=service, deadline=deadline) from None


def _resource_field(d: Descriptor) -> FieldDescriptor | None:
    """The message's one field of a `cuty.*` message type (an event's resource), if it has one."""
    resource = [f for f in d.fields if f.type == FieldDescriptor.TYPE_MESSAGE and not f.is_repeated
                and f.message_type.full_name.startswith("cuty.")]
    return resource[0] if len(resource) == 1 else None


def resource_type(d: Descriptor) -> Descriptor:
    """What an event's data is the JSON of, for a stream of `d` messages (the OpenAPI says it)."""
    f = _resource_field(d)
    return f.message_type if f is not None else d


def frame(msg: Message) -> bytes:
    d = msg.DESCRIPTOR
    out = []
    if "id" in d.fields_by_name:
        out.append(f"id: {msg.id}\n")
    if "type" in d.fields_by_name and msg.type:
        out.append(f"event: {msg.type}\n")
    f = _resource_field(d)
    data = dumps(to_dict(getattr(msg, f.name))) if f is not None else to_json(msg)
    return "".join(out).encode() + b"data: " + data + b"\n\n"


async def events(call: grpc.aio.UnaryStreamCall, first: Message | None, *, heartbeat: float, service: str,
                 deadline: float, trace_id: str, expires_in: float | None = None) -> AsyncIterator[bytes]:
    """The response body: frames and keep-alives until the stream ends, the client leaves, or
    `expires_in` seconds have passed (the token that opened it is no longer accepted)."""
    read: asyncio.Future | None = None
    loop = asyncio.get_running_loop()
    end = None if expires_in is None else loop.time() + expires_in
    try:
        if first is not None:
            yield frame(first)
        while True:
            read = asyncio.ensure_future(call.read())
            while not read.done():
                left = heartbeat if end is None else end - loop.time()
                if left <= 0:
                    yield _expired(trace_id)
                    return
                done, _ = await asyncio.wait({read}, timeout=min(heartbeat, left))
                if not done and (end is None or end > loop.time()):
                    yield KEEP_ALIVE
            msg, read = read.result(), None
            if msg is grpc.aio.EOF:
                return
            yield frame(msg)
            if end is not None and loop.time() >= end:
                yield _expired(trace_id)
                return
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED:
            return
        p = problems.from_rpc_error(e, service=service, deadline=deadline)
        yield b"event: error\ndata: " + p.body(trace_id) + b"\n\n"
    finally:
        if read is not None:
            read.cancel()
        call.cancel()


def _expired(trace_id: str) -> bytes:
    p = problems.Problem(401, "token-expired", "the token that opened this stream has expired; reconnect with "
                         "a fresh token, and Last-Event-ID to resume where it stopped")
    return b"event: error\ndata: " + p.body(trace_id) + b"\n\n"
