"""One-call checkout through the HTTP gateway and the real services: one POST /v1/checkouts with a
paymentMethod buys codes (and a slot), a replay of it charges nothing more, and the PSP's webhook
about the payment the synchronous answer already captured is settled by its one statement."""
from __future__ import annotations

import uuid

import httpx
import pytest_asyncio

from cutylib.testing.procs import wait_for

from checkout_e2e import customer_headers, start_stack


@pytest_asyncio.fixture(scope="module")
async def shop(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("checkout-e2e-one-call"), gateway=True)
    yield s
    await s.close()


async def test_one_post_with_a_payment_method_buys_codes(shop):
    product = await shop.new_product(stock=3, price=2500)
    me = customer_headers()
    body = {"productId": product, "quantity": 2, "paymentMethod": "pm_card_ok"}
    key = {"Idempotency-Key": str(uuid.uuid4())}
    async with httpx.AsyncClient(base_url=shop.stack.gateway_url, timeout=15) as http:
        r = await http.post("/v1/checkouts", json=body, headers={**me, **key})
        assert r.status_code == 200, r.text
        done = r.json()
        assert done["state"] == "CHECKOUT_STATE_COMPLETED", done
        assert done["payment"]["status"] == "PAYMENT_STATUS_SUCCEEDED" and not done["payment"].get("clientSecret")
        assert done["amount"] == {"currencyCode": "TRY", "amountMinor": "5000"}
        assert await shop.order_status(done["id"]) == "delivered"
        assert await shop.code_statuses(done["id"]) == ["delivered", "delivered"]
        got = (await http.get(f"/v1/checkouts/{done['id']}", headers=me)).json()
        assert len(got["codes"]) == 2 and all(c["value"] for c in got["codes"])

        again = await http.post("/v1/checkouts", json=body, headers={**me, **key})  # the client's retry
        assert again.status_code == 200 and again.json() == done
        other = await http.post("/v1/checkouts", json={**body, "quantity": 1}, headers={**me, **key})
        assert other.status_code == 422 and "idempotency-key-reused" in other.text, other.text

    payment_id = done["payment"]["id"]
    ledger = await shop.ledger()
    intent = await shop.db["payments"].fetchval("SELECT psp_intent_id FROM payments WHERE id = $1",
                                                uuid.UUID(payment_id))
    assert [c["intent_id"] for c in ledger["charges"]].count(intent) == 1

    # The PSP's webhook for the payment came through the gateway after the synchronous capture: old
    # news, stored processed by its one statement (the payment and the checkout untouched since).
    async def webhook_processed():
        return await shop.db["payments"].fetchval(
            "SELECT count(*) FROM psp_events WHERE payment_id = $1 AND status = 'processed'", uuid.UUID(payment_id))
    await wait_for(webhook_processed, timeout=10, message="the capture webhook processed")
    assert await shop.db["payments"].fetchval("SELECT version FROM payments WHERE id = $1",
                                              uuid.UUID(payment_id)) == 2  # created, succeeded


async def test_one_post_books_a_slot_and_a_declined_one_gives_it_back(shop):
    (slot,) = await shop.new_slots(1, price=75000)
    async with httpx.AsyncClient(base_url=shop.stack.gateway_url, timeout=15) as http:
        declined = await http.post("/v1/checkouts", json={"slotId": slot, "paymentMethod": "pm_card_declined"},
                                   headers={**customer_headers(), "Idempotency-Key": str(uuid.uuid4())})
        assert declined.status_code == 200, declined.text
        assert declined.json()["state"] == "CHECKOUT_STATE_FAILED"
        assert declined.json()["failureReason"] == "payment-failed"
        assert await shop.hold_status(declined.json()["holdId"]) == "released"
        booked = await http.post("/v1/checkouts", json={"slotId": slot, "paymentMethod": "pm_card_ok"},
                                 headers={**customer_headers(), "Idempotency-Key": str(uuid.uuid4())})
        assert booked.status_code == 200, booked.text
        assert booked.json()["state"] == "CHECKOUT_STATE_COMPLETED"
        assert await shop.hold_status(booked.json()["holdId"]) == "confirmed"
    states = await shop.check_invariants([declined.json()["id"], booked.json()["id"]])
    assert set(states.values()) == {"FAILED", "COMPLETED"}
