"""Over HTTP through the gateway (real processes, the PSP simulator): the merchant's
staff refund a booking partly, then the rest; a replay answers the same refund, a reused key is 422,
an over-refund 409; the PSP's ledger refunded exactly what was captured, once."""
import asyncio
import uuid

import httpx


def state_of(checkout: dict) -> str:
    return checkout["state"].removeprefix("CHECKOUT_STATE_")


async def test_a_partial_refund_then_the_rest_through_the_gateway(http, auth, fresh_key, new_slots, until_state,
                                                                  stack):
    slot = (await new_slots(1))[0]
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**me, **fresh_key()})).json()
    paid = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                           headers={**me, **fresh_key()})
    assert paid.status_code == 200, paid.text
    done = await until_state(co["id"], me)
    assert state_of(done) == "COMPLETED"
    payment = done["payment"]["id"]
    staff = auth("staff")
    path = f"/v1/payments/{payment}:refund"

    no_key = await http.post(path, json={"reason": "x"}, headers=staff)
    assert no_key.status_code == 400, no_key.text
    assert (await http.post(path, json={"reason": "x"}, headers={**me, **fresh_key()})).status_code == 403
    assert (await http.post(path, json={"reason": "x"}, headers={**auth("operator"), **fresh_key()})).status_code == 403
    assert (await http.post(path, json={"amount": {"currencyCode": "TRY", "amountMinor": "1"}},
                            headers={**staff, **fresh_key()})).status_code == 400  # a reason is required

    key = {"Idempotency-Key": uuid.uuid4().hex}
    body = {"amount": {"currencyCode": "TRY", "amountMinor": "25000"}, "reason": "the stylist was 40 minutes late"}
    r = await http.post(path, json=body, headers={**staff, **key})
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["status"] == "REFUND_STATUS_SUCCEEDED" and first["amount"]["amountMinor"] == "25000"
    assert first["requestedBy"].startswith("staff:") and first["pspRefundId"].startswith("re_")
    assert first["payment"]["status"] == "PAYMENT_STATUS_PARTIALLY_REFUNDED"
    assert first["payment"]["refunded"]["amountMinor"] == "25000"
    # Replays (also concurrent ones) answer the same refund; the same key with another body is refused.
    replays = await asyncio.gather(*(http.post(path, json=body, headers={**staff, **key}) for _ in range(4)))
    assert {x.status_code for x in replays} == {200} and {x.json()["id"] for x in replays} == {first["id"]}
    reused = await http.post(path, json={**body, "reason": "something else"}, headers={**staff, **key})
    assert reused.status_code == 422 and reused.json()["type"].endswith("idempotency-key-reused"), reused.text
    over = await http.post(path, json={"amount": {"currencyCode": "TRY", "amountMinor": "50001"}, "reason": "too much"},
                           headers={**staff, **fresh_key()})
    assert over.status_code == 409 and "refund-exceeds-captured" in over.json()["type"], over.text

    rest = await http.post(path, json={"reason": "customer asked for the rest"}, headers={**auth("admin"), **fresh_key()})
    assert rest.status_code == 200, rest.text
    assert rest.json()["amount"]["amountMinor"] == "50000"
    assert rest.json()["payment"]["status"] == "PAYMENT_STATUS_REFUNDED"

    events = (await http.get(f"/v1/payments/{payment}/events", headers=staff)).json()["events"]
    notes = [e["note"] for e in events]
    assert any("25000 TRY" in n and "the stylist was 40 minutes late" in n and "succeeded at the PSP" in n
               for n in notes), notes
    assert any(e["toStatus"] == "refunded" and e["fromStatus"] == "partially_refunded" for e in events)

    async with httpx.AsyncClient(base_url=stack.env["CUTY_PSP_URL"], timeout=10) as psp:
        ledger = (await psp.get("/v1/_ledger")).json()
    intent = first["payment"]["pspIntentId"]
    (charge,) = [c for c in ledger["charges"] if c["intent_id"] == intent]
    assert (charge["amount"], charge["amount_refunded"]) == (75000, 75000)
    assert sorted(r["amount"] for r in ledger["refunds"] if r["intent_id"] == intent) == [25000, 50000]
