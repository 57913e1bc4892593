"""HTTP layer over ASGITransport: routes, status codes and the error envelope."""

import httpx
import pytest_asyncio

from pspsim.app import create_app
from pspsim.settings import Settings


@pytest_asyncio.fixture
async def client():
    app = create_app(Settings(webhook_url="http://127.0.0.1:9/unused", webhook_delay_ms=60_000))
    psp = app.state.psp
    await psp.start()  # ASGITransport does not run the lifespan
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://psp") as c:
        yield c
    await psp.aclose()


def create(client, key="k1", **over):
    body = {"amount": 500, "currency": "TRY", "payment_method": "pm_card_ok", **over}
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/v1/payment_intents", json=body, headers=headers)


async def test_create_get_and_ledger(client):
    r = await create(client)
    assert r.status_code == 200
    intent = r.json()
    assert set(intent) >= {"id", "status", "amount", "currency", "payment_method", "client_secret",
                           "next_action", "metadata", "created"}
    assert (await client.get(f"/v1/payment_intents/{intent['id']}")).json() == intent
    ledger = (await client.get("/v1/_ledger")).json()
    assert ledger["charge_count_by_key"] == {"k1": 1}
    assert ledger["charges"][0] | {"captured_at": 0} == {
        "idempotency_key": "k1", "intent_id": intent["id"], "amount": 500, "amount_refunded": 0,
        "currency": "TRY", "payment_method": "pm_card_ok", "off_session": False, "status": "succeeded",
            "captured_at": 0}
    events = (await client.get("/v1/_events")).json()["events"]
    assert [(e["type"], e["object_id"], e["copies"]) for e in events] == [
        ("payment_intent.succeeded", intent["id"], 1)]


async def test_error_envelopes(client):
    r = await create(client, key=None)
    assert r.status_code == 400 and r.json()["error"]["code"] == "idempotency_key_missing"
    r = await create(client, payment_method="pm_nope")
    assert r.status_code == 400 and r.json()["error"]["param"] == "payment_method"
    r = await client.post("/v1/payment_intents", content=b"{not json", headers={"Idempotency-Key": "x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = await client.post("/v1/payment_intents", json=[1], headers={"Idempotency-Key": "x"})
    assert r.status_code == 400
    r = await client.get("/v1/payment_intents/pi_missing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "resource_missing"
    r = await client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = await client.delete("/v1/payment_intents")
    assert r.status_code == 405


async def test_idempotency_and_faults_over_http(client):
    first = (await create(client, key="same")).json()
    assert (await create(client, key="same")).json()["id"] == first["id"]
    r = await create(client, key="same", amount=501)
    assert r.status_code == 422 and r.json()["error"]["type"] == "idempotency_error"
    r = await client.post("/v1/_faults", json={"fail_next_creates": 1})
    assert r.json()["fail_next_creates"] == 1
    r = await create(client, key="other")
    assert r.status_code == 503 and r.json()["error"]["type"] == "api_error"
    assert (await create(client, key="other")).status_code == 200
    assert (await client.get("/v1/_faults")).json()["fail_next_creates"] == 0


async def test_3ds_routes_cancel_refund_and_reset(client):
    a = (await create(client, key="a", payment_method="pm_card_3ds")).json()
    path = httpx.URL(a["next_action"]["redirect_url"]).path
    assert path == f"/3ds/{a['id']}/complete"
    assert (await client.get(path)).json()["status"] == "succeeded"
    assert (await client.post(path)).json()["status"] == "succeeded"
    r = await client.post(f"/v1/payment_intents/{a['id']}/cancel")
    assert r.status_code == 409 and r.json()["error"]["payment_intent"]["status"] == "succeeded"
    b = (await create(client, key="b", payment_method="pm_card_3ds")).json()
    assert (await client.post(f"/3ds/{b['id']}/fail")).json()["status"] == "failed"
    c = (await create(client, key="c", payment_method="pm_card_3ds")).json()
    r = await client.post(f"/v1/payment_intents/{c['id']}/cancel", json={"cancellation_reason": "expired"})
    assert r.status_code == 200 and r.json()["status"] == "canceled"

    r = await client.post("/v1/refunds", json={"payment_intent": a["id"], "amount": 100},
                          headers={"Idempotency-Key": "r1"})
    assert r.status_code == 200
    refund = r.json()
    assert refund["id"].startswith("re_") and refund["status"] == "succeeded"
    assert (await client.get(f"/v1/refunds/{refund['id']}")).json() == refund
    r = await client.post("/v1/refunds", json={"payment_intent": b["id"]}, headers={"Idempotency-Key": "r2"})
    assert r.status_code == 400
    r = await client.post("/v1/refunds", json={"payment_intent": a["id"]})
    assert r.status_code == 400

    assert (await client.post("/v1/_reset")).status_code == 200
    ledger = (await client.get("/v1/_ledger")).json()
    assert ledger == {"charges": [], "refunds": [], "charge_count_by_key": {}, "totals_by_currency": {}, "disputes": []}


def create_hosted(client, key="kh"):
    body = {"amount": 750, "currency": "TRY", "payment_method_collection": "hosted_page"}
    return client.post("/v1/payment_intents", json=body, headers={"Idempotency-Key": key})


async def test_a_payment_link_waits_for_the_card_the_customer_presents_on_the_hosted_page(client):
    intent = (await create_hosted(client)).json()
    assert intent["status"] == "requires_action" and intent["payment_method"] is None
    page = intent["next_action"]["redirect_url"]
    assert page.endswith(f"/pay/{intent['id']}")
    path = page.removeprefix("http://127.0.0.1:8090")
    html = await client.get(path)
    assert html.status_code == 200 and "pm_card_ok" in html.text and "750" in html.text
    paid = await client.post(path, content="payment_method=pm_card_ok",
                             headers={"content-type": "application/x-www-form-urlencoded"})
    assert paid.status_code == 200 and paid.json()["status"] == "succeeded" and paid.json()["payment_method"] == "pm_card_ok"
    again = await client.post(path, json={"payment_method": "pm_card_ok"})
    assert again.status_code == 200 and again.json()["status"] == "succeeded"
    other = await client.post(path, json={"payment_method": "pm_card_declined"})
    assert other.status_code == 409
    ledger = (await client.get("/v1/_ledger")).json()
    assert ledger["charge_count_by_key"] == {"kh": 1}


async def test_a_hosted_page_refuses_what_it_should(client):
    intent = (await create_hosted(client)).json()
    path = f"/pay/{intent['id']}"
    r = await client.post(path, json={"payment_method": "pm_card_stolen"})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "payment_method")
    r = await client.post(path, json={})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "payment_method")
    # an expired link: the merchant cancelled the intent; the page no longer takes money
    assert (await client.post(f"/v1/payment_intents/{intent['id']}/cancel", json={})).status_code == 200
    assert (await client.post(path, json={"payment_method": "pm_card_ok"})).status_code == 409
    # an intent created with a card has no hosted page; a create names a card or the page, not both
    card = (await create(client, key="kc")).json()
    assert (await client.get(f"/pay/{card['id']}")).status_code == 404
    r = await client.post("/v1/payment_intents", headers={"Idempotency-Key": "kx"}, json={
        "amount": 1, "currency": "TRY", "payment_method": "pm_card_ok", "payment_method_collection": "hosted_page"})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "payment_method")


def create_hosted_with_consent(client, key, consent=150):
    body = {"amount": 750, "currency": "TRY", "payment_method_collection": "hosted_page",
            "off_session_consent": {"amount": consent}}
    return client.post("/v1/payment_intents", json=body, headers={"Idempotency-Key": key})


async def test_a_hosted_page_asks_consent_to_a_later_off_session_charge_and_saves_the_card_only_if_given(client):
    """A payment link of a booking with a no-show fee: the page names the fee; the customer who
    ticks it consents to exactly that amount (the card is saved for one off-session charge, the
    consent recorded with its time); another amount is refused and changes nothing; a customer
    who does not tick it pays, and nothing is saved."""
    intent = (await create_hosted_with_consent(client, "kc1")).json()
    assert intent["off_session_consent"] == {"amount": 150, "currency": "TRY", "accepted": False, "accepted_at": None}
    assert intent["setup_future_usage"] is None
    path = f"/pay/{intent['id']}"
    page = (await client.get(path)).text
    assert 'name="accept_off_session_amount" value="150"' in page and "150 TRY" in page
    for wrong in ({"accept_off_session_amount": 100}, {"accept_off_session_amount": "151"}):
        r = await client.post(path, json={"payment_method": "pm_card_ok", **wrong})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "off_session_consent_changed"), r.text
    r = await client.post(path, json={"payment_method": "pm_card_ok", "accept_off_session_amount": -1})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "accept_off_session_amount")
    seen = (await client.get(f"/v1/payment_intents/{intent['id']}")).json()
    assert seen["status"] == "requires_action" and seen["payment_method"] is None  # nothing changed
    paid = await client.post(path, content="payment_method=pm_card_ok&accept_off_session_amount=150",
                             headers={"content-type": "application/x-www-form-urlencoded"})
    assert paid.status_code == 200, paid.text
    paid = paid.json()
    assert paid["status"] == "succeeded" and paid["saved_payment_method"] and paid["customer"]
    assert paid["off_session_consent"]["accepted"] and paid["off_session_consent"]["accepted_at"]
    # the same visit again answers the same; the same card without the consent is another answer
    again = await client.post(path, json={"payment_method": "pm_card_ok", "accept_off_session_amount": 150})
    assert again.status_code == 200 and again.json() == paid
    assert (await client.post(path, json={"payment_method": "pm_card_ok"})).status_code == 409
    # the saved card takes that one off-session charge
    r = await client.post("/v1/payment_intents", headers={"Idempotency-Key": "fee-1"}, json={
        "amount": 150, "currency": "TRY", "payment_method": paid["saved_payment_method"], "off_session": True,
        "customer": paid["customer"]})
    assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text

    declined = (await create_hosted_with_consent(client, "kc2")).json()
    r = await client.post(f"/pay/{declined['id']}", json={"payment_method": "pm_card_ok"})
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    assert r.json()["saved_payment_method"] is None and not r.json()["off_session_consent"]["accepted"]
    # a page that asks nothing takes no consent
    plain = (await create_hosted(client, key="kc3")).json()
    r = await client.post(f"/pay/{plain['id']}", json={"payment_method": "pm_card_ok", "accept_off_session_amount": 150})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "off_session_consent_changed")


async def test_a_consent_is_asked_on_the_hosted_page_only_and_never_above_the_amount(client):
    for i, body in enumerate((
            {"amount": 750, "currency": "TRY", "payment_method": "pm_card_ok", "off_session_consent": {"amount": 1}},
            {"amount": 750, "currency": "TRY", "payment_method_collection": "hosted_page",
             "setup_future_usage": "off_session", "off_session_consent": {"amount": 1}},
            {"amount": 750, "currency": "TRY", "payment_method_collection": "hosted_page",
             "off_session_consent": {"amount": 751}},
            {"amount": 750, "currency": "TRY", "payment_method_collection": "hosted_page",
             "off_session_consent": {"amount": 1, "currency": "EUR"}})):
        r = await client.post("/v1/payment_intents", json=body, headers={"Idempotency-Key": f"bad-{i}"})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("off_session_consent"), r.text


async def test_a_declined_card_on_the_hosted_page_fails_the_intent(client):
    intent = (await create_hosted(client)).json()
    r = await client.post(f"/pay/{intent['id']}", json={"payment_method": "pm_card_declined"})
    assert r.status_code == 200 and r.json()["status"] == "failed"
