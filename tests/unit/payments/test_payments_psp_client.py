"""The PSP client: retries with the same Idempotency-Key on 5xx / transport errors; an unanswered
call is `PspUnavailable` (unknown), a 4xx is a definitive `PspError`."""
import httpx
import pytest

from payments.psp import PspClient, PspError, PspUnavailable


def client(handler, retries=2) -> PspClient:
    return PspClient("http://psp", retries=retries, backoff=0.001,
                     client=httpx.AsyncClient(base_url="http://psp", transport=httpx.MockTransport(handler)))


async def test_5xx_and_transport_errors_are_retried_with_the_same_key():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Idempotency-Key"))
        if len(seen) == 1:
            raise httpx.ReadTimeout("slow", request=request)
        if len(seen) == 2:
            return httpx.Response(503, json={"error": {"code": "service_unavailable"}})
        return httpx.Response(200, json={"id": "pi_1", "status": "succeeded"})
    psp = client(handler)
    assert (await psp.create_intent("key-1", {"amount": 1}))["id"] == "pi_1"
    assert seen == ["key-1"] * 3


async def test_no_answer_is_unknown_not_failed():
    calls = 0

    def handler(request):
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused", request=request)
    with pytest.raises(PspUnavailable):
        await client(handler, retries=1).get_intent("pi_1")
    assert calls == 2


async def test_4xx_is_definitive_and_carries_the_intent():
    def handler(request):
        return httpx.Response(409, json={"error": {"code": "payment_intent_unexpected_state",
                                                   "payment_intent": {"id": "pi_1", "status": "succeeded"}}})
    with pytest.raises(PspError) as e:
        await client(handler).cancel_intent("pi_1")
    assert (e.value.status, e.value.code, e.value.payment_intent["status"]) == (
        409, "payment_intent_unexpected_state", "succeeded")
