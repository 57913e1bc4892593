"""Service errors arrive as RFC 9457 problems; the gateway's own refusals never reach a service."""
import asyncio
import json

import pytest

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cuty.payments.v1 import checkout_pb2
from cutylib import errors


def raising(exc):
    def fn(req, md):
        raise exc
    return fn


def problem(r, status, type_):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    doc = r.json()
    assert (doc["status"], doc["type"]) == (status, type_)
    assert doc["traceId"] == r.headers["x-trace-id"]
    return doc


async def test_slot_unavailable_with_alternatives(client, script, bearer):
    alts = [booking_pb2.Slot(id=f"alt{i}", resource_id="00000000-0000-4000-8000-000000000007") for i in range(3)]
    script("CreateCheckout", raising(errors.AlreadyExists(
        "slot s1 was taken", reason="slot-unavailable", detail=booking_pb2.SlotUnavailable(slot_id="00000000-0000-4000-8000-000000000003", alternatives=alts))))
    r = await client.post("/v1/checkouts", json={"slotId": "00000000-0000-4000-8000-000000000003"}, headers={**bearer("customer"), "Idempotency-Key": "a"})
    doc = problem(r, 409, "slot-unavailable")
    assert [a["id"] for a in doc["alternatives"]] == ["alt0", "alt1", "alt2"]
    assert doc["alternatives"][0]["resourceId"] == "00000000-0000-4000-8000-000000000007"


async def test_out_of_stock_with_available(client, script, bearer):
    script("CreateCheckout", raising(errors.ResourceExhausted(
        "2 left", reason="out-of-stock", detail=codepool_pb2.OutOfStock(product_id="00000000-0000-4000-8000-000000000014", requested=3, available=2))))
    r = await client.post("/v1/checkouts", json={"productId": "00000000-0000-4000-8000-000000000014", "quantity": 3},
                          headers={**bearer("customer"), "Idempotency-Key": "b"})
    assert problem(r, 409, "out-of-stock")["available"] == 2

# A slot that keeps the contract: only the service (scripted here) can refuse it.
SLOT_INPUT = {"resourceId": "00000000-0000-4000-8000-000000000007", "startTime": "2026-03-08T09:00:00Z",
              "endTime": "2026-03-08T10:00:00Z", "price": {"currencyCode": "TRY", "amountMinor": "75000"}}


async def test_invalid_argument_names_the_json_field(client, script, bearer):
    script("BatchCreateSlots", raising(errors.InvalidArgument("slots[0].end_time", "end_time must be after start_time")))
    r = await client.post("/v1/salons/00000000-0000-4000-8000-000000000003/slots:batchCreate", json={"slots": [SLOT_INPUT]}, headers=bearer("admin"))
    assert problem(r, 400, "invalid-argument")["field"] == "slots[0].endTime"


@pytest.mark.parametrize("exc, status, type_", [
    (errors.NotFound("no checkout ck1"), 404, "not-found"),
    (errors.FailedPrecondition("checkout is CANCELLED, not HELD"), 409, "failed-precondition"),
    (errors.PermissionDenied("no"), 403, "permission-denied"),
    (errors.Aborted("first request still running", reason="idempotency-key-in-flight"), 409, "idempotency-key-in-flight"),
    (errors.InvalidArgument("", "same key, other body", reason="idempotency-key-reused"), 422, "idempotency-key-reused"),
    (errors.Unavailable("database unavailable"), 503, "unavailable"),
    (ValueError("bug in the service"), 500, "internal"),
])
async def test_status_mapping(client, script, bearer, exc, status, type_):
    script("PayCheckout", raising(exc))
    r = await client.post("/v1/checkouts/00000000-0000-4000-8000-000000000001:pay", json={"paymentMethod": "pm_card_ok"},
                          headers={**bearer("customer"), "Idempotency-Key": "c"})
    problem(r, status, type_)


async def test_deadline_exceeded_is_504(start_gateway, fake, script, bearer):
    g = await start_gateway(deadline_seconds=0.2)

    async def slow(req, md):
        await asyncio.sleep(1)
        return checkout_pb2.Checkout()
    script("GetCheckout", slow)
    import httpx
    async with httpx.AsyncClient(base_url=g.url) as c:
        r = await c.get("/v1/checkouts/00000000-0000-4000-8000-000000000001", headers=bearer("customer"))
    problem(r, 504, "deadline-exceeded")


async def test_backend_down_is_503_and_healthz_says_so(start_gateway, bearer):
    from cutylib.pgcluster import free_port
    g = await start_gateway(addr=f"127.0.0.1:{free_port()}")
    import httpx
    async with httpx.AsyncClient(base_url=g.url) as c:
        r = await c.get("/v1/products/00000000-0000-4000-8000-000000000005/stock", headers=bearer("staff"))
        doc = problem(r, 503, "unavailable")
        assert "127.0.0.1" not in doc["detail"] and r.headers["retry-after"] == "1"
        h = await c.get("/healthz")
    assert h.status_code == 503
    assert set(h.json()["services"].values()) == {"UNAVAILABLE"}


async def test_healthz_when_all_serving(client):
    r = await client.get("/healthz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "SERVING", "services": {"booking": "SERVING", "codepool": "SERVING", "payments": "SERVING"}}


async def test_idempotent_replay_is_byte_identical(client, script, bearer):
    stored: dict[str, bytes] = {}

    def create(req, md):
        # The orchestrator keeps the first answer per key; the fake does the same.
        key = md["idempotency-key"]
        if key not in stored:
            c = checkout_pb2.Checkout(id=f"ck-{len(stored)}", kind=checkout_pb2.CHECKOUT_KIND_BOOKING, state=checkout_pb2.CHECKOUT_STATE_HELD, slot_id=req.slot_id)
            c.expire_time.FromJsonString("2026-03-08T09:05:00.123456Z")
            c.amount.currency_code, c.amount.amount_minor = "TRY", 75000
            stored[key] = c.SerializeToString()
        return checkout_pb2.Checkout.FromString(stored[key])
    script("CreateCheckout", create)
    h = {**bearer("customer"), "Idempotency-Key": "replay-1"}
    first = await client.post("/v1/checkouts", content=b'{"slotId": "00000000-0000-4000-8000-000000000003"}', headers=h)
    again = await client.post("/v1/checkouts", content=b'{"slot_id":"00000000-0000-4000-8000-000000000003"}', headers=h)
    assert first.status_code == again.status_code == 200
    assert first.content == again.content
    assert json.loads(first.content)["expireTime"] == "2026-03-08T09:05:00.123456Z"


async def test_missing_idempotency_key_never_reaches_the_service(client, fake, bearer):
    before = len(fake.calls)
    for path, body in [("/v1/checkouts", {"slotId": "00000000-0000-4000-8000-000000000003"}), ("/v1/checkouts/00000000-0000-4000-8000-000000000001:pay", {"paymentMethod": "pm_card_ok"})]:
        r = await client.post(path, json=body, headers=bearer("customer"))
        assert problem(r, 400, "idempotency-key-required")["field"] == "Idempotency-Key"
        r = await client.post(path, json=body, headers={**bearer("customer"), "Idempotency-Key": "x" * 256})
        problem(r, 400, "invalid-argument")
    assert len(fake.calls) == before
