"""The gateway enforces the contracts' rules (the protos' buf.validate annotations) after
transcoding: a request that breaks them is a 400 naming the field in its JSON spelling, with the
same detail a service gives over gRPC for the same message, and it never reaches a service."""
import json

import pytest

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cuty.payments.v1 import checkout_pb2
from cutylib import validation

SALON = "00000000-0000-4000-8000-000000000003"
SLOT = {"resourceId": "00000000-0000-4000-8000-000000000007", "startTime": "2026-03-08T09:00:00Z",
        "endTime": "2026-03-08T10:00:00Z", "price": {"currencyCode": "TRY", "amountMinor": "75000"}}
IDEM = {"Idempotency-Key": "rules-1"}

CASES = [
    # method, path, role, headers, body, JSON field, the same request as a message (for the gRPC detail)
    ("POST", "/v1/products", "admin", {}, {"sku": "bad sku!", "name": "Gift card", "price": {"currencyCode": "TRY"}},
     "sku", codepool_pb2.CreateProductRequest(sku="bad sku!", name="Gift card", price={"currency_code": "TRY"})),
    ("GET", "/v1/checkouts/not-a-uuid", "customer", {}, None, "checkoutId",
     checkout_pb2.GetCheckoutRequest(checkout_id="not-a-uuid")),
    ("POST", "/v1/checkouts", "customer", IDEM, {"productId": SALON, "quantity": 101}, "quantity",
     checkout_pb2.CreateCheckoutRequest(product_id=SALON, quantity=101)),
    ("POST", "/v1/checkouts", "customer", IDEM, {}, "slotId", checkout_pb2.CreateCheckoutRequest()),
    ("GET", f"/v1/salons/{SALON}/slots?startTime=2026-03-08T00:00:00Z&endTime=2026-03-09T00:00:00Z&pageSize=501",
     "customer", {}, None, "pageSize", booking_pb2.ListSlotsRequest(
         salon_id=SALON, start_time={"seconds": 1772928000}, end_time={"seconds": 1773014400}, page_size=501)),
    ("POST", f"/v1/salons/{SALON}/slots:batchCreate", "admin", {},
     {"slots": [SLOT, {**SLOT, "price": {"currencyCode": "try", "amountMinor": "1"}}]}, "slots[1].price.currencyCode",
     booking_pb2.BatchCreateSlotsRequest(salon_id=SALON, slots=[
         booking_pb2.SlotInput(resource_id=SLOT["resourceId"], start_time={"seconds": 1}, end_time={"seconds": 2},
                               price={"currency_code": "TRY", "amount_minor": 75000}),
         booking_pb2.SlotInput(resource_id=SLOT["resourceId"], start_time={"seconds": 1}, end_time={"seconds": 2},
                               price={"currency_code": "try", "amount_minor": 1})])),
]


@pytest.mark.parametrize("method, path, role, headers, body, field, message", CASES, ids=[c[5] for c in CASES])
async def test_a_request_breaking_its_contract_is_a_400_naming_the_field(client, fake, bearer, method, path, role,
                                                                         headers, body, field, message):
    before = len(fake.calls)
    r = await client.request(method, path, headers={**bearer(role), **headers},
                             content=None if body is None else json.dumps(body))
    assert r.status_code == 400, r.text
    problem = r.json()
    assert problem["type"] == "invalid-argument" and problem["field"] == field
    with pytest.raises(validation.RequestInvalid) as e:
        validation.check(message)
    assert problem["detail"] == e.value.message  # the same words a service says over gRPC
    assert len(fake.calls) == before, "a request that breaks its contract reached a service"


async def test_every_violation_is_listed_in_one_answer(client, bearer):
    r = await client.post(f"/v1/salons/{SALON}/slots:batchCreate", headers=bearer("admin"),
                          content=json.dumps({"slots": [{"resourceId": "x"}]}))
    detail = r.json()["detail"]
    assert r.status_code == 400 and r.json()["field"] == "slots[0].resourceId"
    for part in ("slots[0].resource_id: must be a valid UUID", "slots[0].start_time: value is required",
                 "slots[0].end_time: value is required", "slots[0].price: value is required"):
        assert part in detail
