"""The call's deadline as the server interceptor records it, refuses it, and hands it on (onward
gRPC calls), without a network: fakes of grpc's servicer context and multicallable."""
import asyncio
import time

import grpc
import pytest

from cutylib import deadlines, errors
from cutylib.grpc_client import Channel
from cutylib.tls import Transport
from cutylib.grpc_server import TrustAndErrorInterceptor, Trust

METHOD = "/grpc.health.v1.Health/Check"  # open to any caller: no caller table needed here


class Context:
    def __init__(self, seconds_left, cancelled=False):
        self.seconds_left = seconds_left
        self._cancelled = cancelled
        self.aborted = None

    def invocation_metadata(self):
        return ()

    def auth_context(self):
        return {}

    def time_remaining(self):
        return self.seconds_left

    def cancelled(self):
        return self._cancelled

    async def abort_with_status(self, status):
        self.aborted = status.code
        raise grpc.aio.AbortError()


def _wrapped(behavior, *, streaming=False, max_streams=None):
    interceptor = TrustAndErrorInterceptor(Trust("booking"), max_streams=max_streams)
    if streaming:
        handler = grpc.unary_stream_rpc_method_handler(behavior)
        return interceptor._wrap(METHOD, handler).unary_stream, interceptor
    return interceptor._wrap(METHOD, grpc.unary_unary_rpc_method_handler(behavior)).unary_unary, interceptor


async def test_the_handler_sees_the_calls_deadline_and_nothing_after_it():
    seen = []

    async def behavior(request, context):
        seen.append(deadlines.remaining())
        return "ok"

    call, _ = _wrapped(behavior)
    assert await call(None, Context(2.0)) == "ok"
    assert 1.9 < seen[0] <= 2.0
    assert await call(None, Context(None)) == "ok"
    assert seen[1] is None  # no deadline, none recorded
    assert deadlines.remaining() is None  # reset after the call


@pytest.mark.parametrize("context", [Context(0.0), Context(deadlines.MARGIN_SECONDS / 2)], ids=["passed", "nearly"])
async def test_a_call_whose_deadline_is_spent_on_arrival_is_not_started(context):
    started = []

    async def behavior(request, context):
        started.append(True)

    call, _ = _wrapped(behavior)
    with pytest.raises(grpc.aio.AbortError):
        await call(None, context)
    assert context.aborted == grpc.StatusCode.DEADLINE_EXCEEDED
    assert started == []


async def test_a_call_cancelled_before_it_starts_is_not_started():
    started = []

    async def behavior(request, context):
        started.append(True)

    call, _ = _wrapped(behavior)
    with pytest.raises(asyncio.CancelledError):
        await call(None, Context(5.0, cancelled=True))
    assert started == []


async def test_streams_beyond_their_cap_are_refused_and_their_places_come_back():
    release = asyncio.Event()

    async def behavior(request, context):
        yield "first"
        await release.wait()

    call, interceptor = _wrapped(behavior, streaming=True, max_streams=1)
    open_stream = call(None, Context(None))
    assert await open_stream.__anext__() == "first"
    refused = Context(None)
    with pytest.raises(grpc.aio.AbortError):
        await call(None, refused).__anext__()
    assert refused.aborted == grpc.StatusCode.RESOURCE_EXHAUSTED
    release.set()
    with pytest.raises(StopAsyncIteration):
        await open_stream.__anext__()
    assert interceptor.open_streams == 0


def test_onward_calls_get_at_most_the_time_the_call_has_left():
    timeouts = []

    class Recording:  # a grpc channel whose calls record their timeout
        def unary_unary(self, method):
            return lambda request, timeout, metadata: timeouts.append(timeout)

    call = Channel(Recording, 5.0, Transport.plaintext("payments")).unary_unary("/x")
    call(None)
    call(None, timeout=1.0)
    with deadlines.within(time.monotonic() + 0.5):
        call(None)
        call(None, timeout=0.2)
    with deadlines.within(time.monotonic() - 1):
        call(None)
    assert timeouts[:2] == [5.0, 1.0]
    assert 0.4 < timeouts[2] <= 0.5 and timeouts[3] == 0.2
    assert timeouts[4] == 0.0


def test_the_budget_keeps_the_margin_back():
    assert deadlines.budget("x") is None
    with deadlines.within(time.monotonic() + 1.0):
        assert 1.0 - deadlines.MARGIN_SECONDS - 0.01 < deadlines.budget("x") <= 1.0 - deadlines.MARGIN_SECONDS
    with deadlines.within(time.monotonic() + deadlines.MARGIN_SECONDS / 2):
        with pytest.raises(errors.DeadlineExceeded):
            deadlines.budget("x")
