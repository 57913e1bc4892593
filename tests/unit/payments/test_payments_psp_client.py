"""The PSP client: retries with the same Idempotency-Key on 5xx / transport errors; an unanswered
call is `PspUnavailable` (unknown), a 4xx is a definitive `PspError`. Against a real local HTTP
server (aiohttp's test server): what the client sees is what a socket gives it."""
import asyncio
import contextlib
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from payments.psp import PspClient, PspError, PspUnavailable


@contextlib.asynccontextmanager
async def psp(handler, retries=2, timeout=0.5):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app)
    await server.start_server()
    client = PspClient(str(server.make_url("")), retries=retries, backoff=0.001, timeout=timeout)
    try:
        yield client
    finally:
        await client.aclose()
        await server.close()


async def test_5xx_and_transport_errors_are_retried_with_the_same_key():
    seen = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Idempotency-Key"), await request.json()))
        if len(seen) == 1:
            await asyncio.sleep(1)  # longer than the client's timeout: no answer
        if len(seen) == 2:
            return web.json_response({"error": {"code": "service_unavailable"}}, status=503)
        return web.json_response({"id": "pi_1", "status": "succeeded"})
    async with psp(handler, timeout=0.3) as client:
        assert (await client.create_intent("key-1", {"amount": 1}))["id"] == "pi_1"
    assert seen == [("key-1", {"amount": 1})] * 3


async def test_no_answer_is_unknown_not_failed():
    with socket.socket() as s:  # a port nobody listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = PspClient(f"http://127.0.0.1:{port}", retries=1, backoff=0.001)
    try:
        with pytest.raises(PspUnavailable, match="2 attempts"):
            await client.get_intent("pi_1")
    finally:
        await client.aclose()


async def test_4xx_is_definitive_and_carries_the_intent():
    calls = 0

    async def handler(request):
        nonlocal calls
        calls += 1
        assert request.path == "/v1/payment_intents/pi_1/cancel"
        return web.json_response({"error": {"code": "payment_intent_unexpected_state",
                                            "payment_intent": {"id": "pi_1", "status": "succeeded"}}}, status=409)
    async with psp(handler) as client:
        with pytest.raises(PspError) as e:
            await client.cancel_intent("pi_1")
    assert (e.value.status, e.value.code, e.value.payment_intent["status"]) == (
        409, "payment_intent_unexpected_state", "succeeded")
    assert calls == 1  # a definitive answer is not retried


async def test_a_4xx_without_json_keeps_the_text():
    async def handler(request):
        return web.Response(status=400, text="bad gateway config")
    async with psp(handler) as client:
        with pytest.raises(PspError) as e:
            await client.get_intent("pi_2")
    assert e.value.status == 400 and "bad gateway config" in str(e.value)
