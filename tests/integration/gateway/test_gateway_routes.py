"""Every annotated route reaches its RPC with the request transcoded and the principal attached."""
import json

import jwt
import pytest

from cuty.booking.v1 import booking_pb2
from cuty.payments.v1 import checkout_pb2

IDEM = {"Idempotency-Key": "k-1"}

# method, path, headers role, extra headers, body, rpc, expected request fields (proto names)
ROUTES = [
    ("POST", "/v1/salons", "admin", {}, {"name": "Saç", "timeZone": "Europe/Istanbul"}, "CreateSalon",
     {"name": "Saç", "time_zone": "Europe/Istanbul"}),
    ("POST", "/v1/salons/00000000-0000-4000-8000-000000000003/resources", "admin", {}, {"name": "Ayşe"}, "CreateResource", {"salon_id": "00000000-0000-4000-8000-000000000003", "name": "Ayşe"}),
    ("POST", "/v1/salons/00000000-0000-4000-8000-000000000003/slots:batchCreate", "admin", {},
     {"slots": [{"resourceId": "00000000-0000-4000-8000-000000000007", "startTime": "2026-03-08T09:00:00+03:00", "endTime": "2026-03-08T10:00:00+03:00",
                 "price": {"currencyCode": "TRY", "amountMinor": "75000"}}]}, "BatchCreateSlots", {"salon_id": "00000000-0000-4000-8000-000000000003"}),
    ("GET", "/v1/salons/00000000-0000-4000-8000-000000000003/slots?startTime=2026-03-08T00:00:00Z&endTime=2026-03-09T00:00:00Z&availableOnly=true", "customer", {}, None, "ListSlots",
     {"salon_id": "00000000-0000-4000-8000-000000000003", "available_only": True}),
    ("POST", "/v1/products", "admin", {}, {"sku": "GC-50", "name": "Gift card",
                                           "price": {"currencyCode": "TRY", "amountMinor": 5000}}, "CreateProduct", {"sku": "GC-50"}),
    ("POST", "/v1/products/00000000-0000-4000-8000-000000000005/codes:import", "admin", {}, {"batchRef": "b1", "codes": ["A", "B"]}, "ImportCodeBatch",
     {"product_id": "00000000-0000-4000-8000-000000000005", "batch_ref": "b1", "codes": ["A", "B"]}),
    ("GET", "/v1/products/00000000-0000-4000-8000-000000000005/stock", "staff", {}, None, "GetStock", {"product_id": "00000000-0000-4000-8000-000000000005"}),
    ("GET", "/v1/products/00000000-0000-4000-8000-000000000005/codes?pageSize=10", "staff", {}, None, "ListCodes", {"product_id": "00000000-0000-4000-8000-000000000005", "page_size": 10}),
    ("POST", "/v1/codes/00000000-0000-4000-8000-000000000006:reveal", "admin", {}, None, "RevealCode", {"code_id": "00000000-0000-4000-8000-000000000006"}),
    ("POST", "/v1/checkouts", "customer", IDEM, {"slotId": "00000000-0000-4000-8000-000000000004"}, "CreateCheckout", {"slot_id": "00000000-0000-4000-8000-000000000004"}),
    ("POST", "/v1/checkouts/00000000-0000-4000-8000-000000000001:pay", "customer", IDEM, {"paymentMethod": "pm_card_ok"}, "PayCheckout",
     {"checkout_id": "00000000-0000-4000-8000-000000000001", "payment_method": "pm_card_ok"}),
    ("GET", "/v1/checkouts/00000000-0000-4000-8000-000000000001", "customer", {}, None, "GetCheckout", {"checkout_id": "00000000-0000-4000-8000-000000000001"}),
    ("POST", "/v1/checkouts/00000000-0000-4000-8000-000000000001:cancel", "customer", {}, {}, "CancelCheckout", {"checkout_id": "00000000-0000-4000-8000-000000000001"}),
    ("GET", "/v1/payments/00000000-0000-4000-8000-000000000008/events", "staff", {}, None, "GetPaymentTimeline", {"payment_id": "00000000-0000-4000-8000-000000000008"}),
    ("GET", "/v1/payments:lookup?pspIntentId=pi_1", "staff", {}, None, "LookupPayment", {"psp_intent_id": "pi_1"}),
]


CODEPOOL_RPCS = {"CreateProduct", "ImportCodeBatch", "GetStock", "ListCodes", "RevealCode"}


@pytest.mark.parametrize("method, path, role, headers, body, rpc, fields", ROUTES, ids=[r[5] for r in ROUTES])
async def test_route_reaches_its_rpc(client, fake, bearer, method, path, role, headers, body, rpc, fields):
    h = {**bearer(role, sub=f"{role}-7"), **headers}
    r = await client.request(method, path, headers=h, content=None if body is None else json.dumps(body))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    call = fake.last(rpc)
    for k, v in fields.items():
        got = getattr(call.request, k)
        assert (list(got) if isinstance(v, list) else got) == v, k
    assert (call.who.subject, call.who.role) == (f"{role}-7", role)  # verified from the signed assertion
    # Signed for the one service that owns the RPC (CheckoutService: payments), no other.
    owner = {"CreateSalon": "booking", "CreateResource": "booking", "BatchCreateSlots": "booking",
             "ListSlots": "booking"}.get(rpc, "codepool" if rpc in CODEPOOL_RPCS else "payments")
    assert jwt.decode(call.metadata["cuty-user"], options={"verify_signature": False})["aud"] == f"cuty-{owner}"
    assert "cuty-subject" not in call.metadata and "cuty-role" not in call.metadata
    if headers is IDEM:
        assert call.metadata["idempotency-key"] == "k-1"
    else:
        assert "idempotency-key" not in call.metadata


async def test_response_is_proto3_json(client, fake, bearer):
    def slots(req, md):
        s = booking_pb2.Slot(id="00000000-0000-4000-8000-000000000003", resource_id="00000000-0000-4000-8000-000000000007", local_start_time="2026-03-08T12:00:00+03:00")
        s.start_time.FromJsonString("2026-03-08T09:00:00Z")
        s.price.currency_code, s.price.amount_minor = "TRY", 75000
        return booking_pb2.ListSlotsResponse(slots=[s])
    fake.scripts["ListSlots"] = slots
    try:
        r = await client.get("/v1/salons/00000000-0000-4000-8000-000000000003/slots?startTime=2026-03-08T00:00:00Z&endTime=2026-03-09T00:00:00Z", headers=bearer("customer"))
    finally:
        del fake.scripts["ListSlots"]
    assert r.json() == {"slots": [{"id": "00000000-0000-4000-8000-000000000003", "salonId": "", "resourceId": "00000000-0000-4000-8000-000000000007", "startTime": "2026-03-08T09:00:00Z",
                                   "localStartTime": "2026-03-08T12:00:00+03:00",
                                   "price": {"currencyCode": "TRY", "amountMinor": "75000"}, "available": False,
                                   "serviceId": "", "merchantId": ""}],
                        "nextPageToken": ""}


async def test_enum_names_in_responses(client, fake, bearer):
    fake.scripts["GetCheckout"] = lambda req, md: checkout_pb2.Checkout(id=req.checkout_id, kind=checkout_pb2.CHECKOUT_KIND_BOOKING,
                                                                       state=checkout_pb2.CHECKOUT_STATE_AWAITING_ACTION)
    try:
        r = await client.get("/v1/checkouts/00000000-0000-4000-8000-000000000002", headers=bearer("customer"))
    finally:
        del fake.scripts["GetCheckout"]
    assert {k: v for k, v in r.json().items() if v not in ("", 0, [])} == {
        "id": "00000000-0000-4000-8000-000000000002", "kind": "CHECKOUT_KIND_BOOKING", "state": "CHECKOUT_STATE_AWAITING_ACTION"}
    assert r.json()["quantity"] == 0 and r.json()["codes"] == []  # unpopulated fields are written


async def test_webhook_passes_raw_body_and_signature_without_a_token(client, fake, bearer):
    raw = b'{"id":"evt_1",  "type":"payment_intent.succeeded"}\n'
    r = await client.post("/v1/psp/webhooks", content=raw, headers={"Cuty-Signature": "t=1,v1=abc"})
    assert r.status_code == 200, r.text
    call = fake.last("HandlePspWebhook")
    assert call.request.payload == raw
    assert call.metadata["cuty-signature"] == "t=1,v1=abc"
    assert "cuty-user" not in call.metadata and call.who.role == "anonymous"


async def test_unknown_route_and_wrong_method(client, bearer):
    r = await client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    r = await client.delete("/v1/checkouts/00000000-0000-4000-8000-000000000001", headers=bearer("customer"))
    assert r.status_code == 405 and r.headers["allow"] == "GET"


@pytest.mark.parametrize("verb", ["pay", "cancel", "reschedule", "retry"])
async def test_a_wrong_method_on_a_custom_method_allows_exactly_its_own(client, bearer, fake, verb):
    """`GET /v1/checkouts/{id}:pay` is not GetCheckout of an id "x:pay": 405, Allow: POST (the
    document's one method for that path), and nothing reaches a service."""
    path = f"/v1/checkouts/00000000-0000-4000-8000-000000000001:{verb}"
    before = len(fake.calls)
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        r = await client.request(method, path, headers=bearer("customer"))
        assert r.status_code == 405 and r.headers["allow"] == "POST", (method, verb, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    assert len(fake.calls) == before


async def test_openapi_json_is_served(client):
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert "post" in doc["paths"]["/v1/checkouts/{checkout_id}:pay"]
    assert doc["paths"]["/v1/psp/webhooks"]["post"]["security"] == []
