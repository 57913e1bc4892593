"""Every annotated route reaches its RPC with the request transcoded and the principal attached."""
import json

import pytest

from cuty.booking.v1 import booking_pb2
from cuty.payments.v1 import checkout_pb2

IDEM = {"Idempotency-Key": "k-1"}

# method, path, headers role, extra headers, body, rpc, expected request fields (proto names)
ROUTES = [
    ("POST", "/v1/salons", "admin", {}, {"name": "Saç", "timeZone": "Europe/Istanbul"}, "CreateSalon",
     {"name": "Saç", "time_zone": "Europe/Istanbul"}),
    ("POST", "/v1/salons/s1/resources", "admin", {}, {"name": "Ayşe"}, "CreateResource", {"salon_id": "s1", "name": "Ayşe"}),
    ("POST", "/v1/salons/s1/slots:batchCreate", "admin", {},
     {"slots": [{"resourceId": "r1", "startTime": "2026-03-08T09:00:00+03:00", "endTime": "2026-03-08T10:00:00+03:00",
                 "price": {"currencyCode": "TRY", "amountMinor": "75000"}}]}, "BatchCreateSlots", {"salon_id": "s1"}),
    ("GET", "/v1/salons/s1/slots?startTime=2026-03-08T00:00:00Z&availableOnly=true", "customer", {}, None, "ListSlots",
     {"salon_id": "s1", "available_only": True}),
    ("POST", "/v1/products", "admin", {}, {"sku": "GC-50", "name": "Gift card",
                                           "price": {"currencyCode": "TRY", "amountMinor": 5000}}, "CreateProduct", {"sku": "GC-50"}),
    ("POST", "/v1/products/p1/codes:import", "admin", {}, {"batchRef": "b1", "codes": ["A", "B"]}, "ImportCodeBatch",
     {"product_id": "p1", "batch_ref": "b1", "codes": ["A", "B"]}),
    ("GET", "/v1/products/p1/stock", "staff", {}, None, "GetStock", {"product_id": "p1"}),
    ("GET", "/v1/products/p1/codes?pageSize=10", "staff", {}, None, "ListCodes", {"product_id": "p1", "page_size": 10}),
    ("POST", "/v1/codes/c1:reveal", "admin", {}, None, "RevealCode", {"code_id": "c1"}),
    ("POST", "/v1/checkouts", "customer", IDEM, {"slotId": "s9"}, "CreateCheckout", {"slot_id": "s9"}),
    ("POST", "/v1/checkouts/ck1:pay", "customer", IDEM, {"paymentMethod": "pm_card_ok"}, "PayCheckout",
     {"checkout_id": "ck1", "payment_method": "pm_card_ok"}),
    ("GET", "/v1/checkouts/ck1", "customer", {}, None, "GetCheckout", {"checkout_id": "ck1"}),
    ("POST", "/v1/checkouts/ck1:cancel", "customer", {}, {}, "CancelCheckout", {"checkout_id": "ck1"}),
    ("GET", "/v1/payments/pay1/events", "staff", {}, None, "GetPaymentTimeline", {"payment_id": "pay1"}),
    ("GET", "/v1/payments:lookup?pspIntentId=pi_1", "staff", {}, None, "LookupPayment", {"psp_intent_id": "pi_1"}),
]


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
    assert "cuty-subject" not in call.metadata and "cuty-role" not in call.metadata
    if headers is IDEM:
        assert call.metadata["idempotency-key"] == "k-1"
    else:
        assert "idempotency-key" not in call.metadata


async def test_response_is_proto3_json(client, fake, bearer):
    def slots(req, md):
        s = booking_pb2.Slot(id="s1", resource_id="r1", local_start_time="2026-03-08T12:00:00+03:00")
        s.start_time.FromJsonString("2026-03-08T09:00:00Z")
        s.price.currency_code, s.price.amount_minor = "TRY", 75000
        return booking_pb2.ListSlotsResponse(slots=[s])
    fake.scripts["ListSlots"] = slots
    try:
        r = await client.get("/v1/salons/s1/slots", headers=bearer("customer"))
    finally:
        del fake.scripts["ListSlots"]
    assert r.json() == {"slots": [{"id": "s1", "salonId": "", "resourceId": "r1", "startTime": "2026-03-08T09:00:00Z",
                                   "localStartTime": "2026-03-08T12:00:00+03:00",
                                   "price": {"currencyCode": "TRY", "amountMinor": "75000"}, "available": False,
                                   "serviceId": ""}],
                        "nextPageToken": ""}


async def test_enum_names_in_responses(client, fake, bearer):
    fake.scripts["GetCheckout"] = lambda req, md: checkout_pb2.Checkout(id=req.checkout_id, kind=checkout_pb2.CHECKOUT_KIND_BOOKING,
                                                                       state=checkout_pb2.CHECKOUT_STATE_AWAITING_ACTION)
    try:
        r = await client.get("/v1/checkouts/ck2", headers=bearer("customer"))
    finally:
        del fake.scripts["GetCheckout"]
    assert {k: v for k, v in r.json().items() if v not in ("", 0, [])} == {
        "id": "ck2", "kind": "CHECKOUT_KIND_BOOKING", "state": "CHECKOUT_STATE_AWAITING_ACTION"}
    assert r.json()["quantity"] == 0 and r.json()["codes"] == []  # unpopulated fields are written (issue 10)


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
    r = await client.delete("/v1/checkouts/ck1", headers=bearer("customer"))
    assert r.status_code == 405 and "GET" in r.headers["allow"]


async def test_openapi_json_is_served(client):
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert "post" in doc["paths"]["/v1/checkouts/{checkout_id}:pay"]
    assert doc["paths"]["/v1/psp/webhooks"]["post"]["security"] == []
