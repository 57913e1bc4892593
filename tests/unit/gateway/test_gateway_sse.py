"""Server-streaming routes as Server-Sent Events (gateway/sse.py), without a network."""
from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from cuty.payments.v1 import checkout_pb2 as pb
from gateway import sse


class FakeCall:
    def __init__(self, metadata=(sse.STREAM_OPEN,)):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.metadata = metadata
        self.cancelled = False

    async def initial_metadata(self):
        return self.metadata

    async def read(self):
        return await self.queue.get()

    def cancel(self):
        self.cancelled = True


def event(i: int, kind: str = "state-changed") -> pb.CheckoutEvent:
    return pb.CheckoutEvent(id=i, type=kind, checkout=pb.Checkout(id="c-1", state=pb.CHECKOUT_STATE_HELD))


def test_a_frame_is_id_event_and_the_resource_as_one_line_of_json():
    raw = sse.frame(event(42, "payment-action-required")).decode()
    lines = raw.split("\n")
    assert lines[0] == "id: 42" and lines[1] == "event: payment-action-required" and raw.endswith("\n\n")
    data = json.loads(lines[2].removeprefix("data: "))
    assert data["id"] == "c-1" and data["state"] == "CHECKOUT_STATE_HELD"


async def test_keep_alives_while_silent_then_events_then_the_call_is_closed_at_the_end():
    call = FakeCall()
    body = sse.events(call, None, heartbeat=0.02, service="payments", deadline=1, trace_id="t")
    assert await anext(body) == sse.KEEP_ALIVE
    await call.queue.put(event(1))
    chunks = [await anext(body)]
    while chunks[-1] == sse.KEEP_ALIVE:
        chunks.append(await anext(body))
    assert chunks[-1].startswith(b"id: 1\n")
    await call.queue.put(grpc.aio.EOF)
    with pytest.raises(StopAsyncIteration):
        while True:
            await anext(body)
    assert call.cancelled


async def test_a_client_that_goes_away_cancels_the_call():
    call = FakeCall()
    body = sse.events(call, event(7), heartbeat=10, service="payments", deadline=1, trace_id="t")
    assert (await anext(body)).startswith(b"id: 7\n")
    waiting = asyncio.ensure_future(anext(body))
    await asyncio.sleep(0.01)
    waiting.cancel()  # starlette cancels the body when the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await body.aclose()
    assert call.cancelled


async def test_the_stream_is_open_only_after_the_backends_initial_metadata():
    assert await sse.opened(FakeCall(), service="payments", deadline=1) is None
    eager = FakeCall(metadata=())
    await eager.queue.put(event(3))
    assert (await sse.opened(eager, service="payments", deadline=1)).id == 3


async def test_a_busy_stream_still_ends_when_its_token_expires():
    """Events arriving all the time do not keep a stream past its token: it ends with one
    `event: error` (401 token-expired) and the call is cancelled."""
    call = FakeCall()
    await call.queue.put(event(0))
    body = sse.events(call, None, heartbeat=10, service="payments", deadline=1, trace_id="t", expires_in=0.2)
    chunks, i = [], 0
    async for chunk in body:
        chunks.append(chunk)
        i += 1
        await call.queue.put(event(i))
        await asyncio.sleep(0.01)
        assert i < 200, "the stream outlived its token"
    assert chunks[-1].startswith(b"event: error\n")
    assert json.loads(chunks[-1].split(b"data: ", 1)[1])["type"] == "token-expired"
    assert call.cancelled
