"""Staff book for a customer over HTTP, through the real stack (gateway, payments, booking, the PSP
simulator as processes; docs/checkout.md, "Staff book for a customer", "No-show"): a receptionist's
pay-at-venue booking marked paid, a payment link paid by the customer on the simulator's hosted
page, a link that expires and gives the time back, the no-show window, and another merchant's
staff who find nothing."""
import asyncio
import datetime as dt
import uuid

import asyncpg
import httpx

from cutylib.config import with_database

from tests.e2e.gateway.conftest import make_token

VENUE, LINK = "SETTLEMENT_AT_VENUE", "SETTLEMENT_PAYMENT_LINK"


def state_of(checkout: dict) -> str:
    return checkout["state"].removeprefix("CHECKOUT_STATE_")


def other_merchant_staff() -> dict:
    return {"Authorization": f"Bearer {make_token('staff', org='merchant-' + uuid.uuid4().hex[:8])}"}


async def _slot_starting_in(http, auth, salon: str, seconds: float) -> dict:
    admin = auth("admin")
    res = await http.post(f"/v1/salons/{salon}/resources", json={"name": f"chair {uuid.uuid4().hex[:6]}"},
                          headers=admin)
    start = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    r = await http.post(f"/v1/salons/{salon}/slots:batchCreate", headers=admin, json={"slots": [{
        "resourceId": res.json()["id"], "startTime": start.isoformat(),
        "endTime": (start + dt.timedelta(hours=1)).isoformat(),
        "price": {"currencyCode": "TRY", "amountMinor": "75000"}}]})
    assert r.status_code == 200, r.text
    return r.json()["slots"][0]


async def _events(stack, checkout_id: str) -> list[str]:
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        rows = await db.fetch("SELECT type FROM merchant_events WHERE checkout_id = $1 ORDER BY created_at",
                              uuid.UUID(checkout_id))
    finally:
        await db.close()
    return [r["type"] for r in rows]


async def _until(http, checkout_id: str, headers: dict, states: set[str], timeout: float = 30) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        c = (await http.get(f"/v1/checkouts/{checkout_id}", headers=headers)).json()
        if state_of(c) in states or asyncio.get_running_loop().time() > deadline:
            return c
        await asyncio.sleep(0.2)


async def test_pay_at_venue_booking_marked_paid(http, auth, fresh_key, new_slots, stack):
    slot = (await new_slots(1, days_ahead=3))[0]
    staff, customer_sub = auth("staff"), f"customer-{uuid.uuid4().hex[:8]}"
    body = {"slotId": slot["id"], "customerId": customer_sub, "settlement": VENUE}

    # Staff never choose a payment method, and only staff and admins book for a customer.
    r = await http.post("/v1/checkouts:createForCustomer", json={**body, "paymentMethod": "pm_card_ok"},
                        headers={**staff, **fresh_key()})
    assert (r.status_code, r.json().get("field")) == (400, "paymentMethod"), r.text
    r = await http.post("/v1/checkouts:createForCustomer", json=body, headers={**auth("customer"), **fresh_key()})
    assert r.status_code == 403
    # Another merchant's staff cannot book this salon's slot: it does not exist for them.
    r = await http.post("/v1/checkouts:createForCustomer", json=body, headers={**other_merchant_staff(), **fresh_key()})
    assert r.status_code == 404, r.text
    # ... and left nothing: no checkout, and the slot's hold let go at once (this merchant books it below).
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        assert await db.fetchval("SELECT count(*) FROM checkouts WHERE slot_id = $1", uuid.UUID(slot["id"])) == 0
    finally:
        await db.close()

    key = fresh_key()
    r = await http.post("/v1/checkouts:createForCustomer", json=body, headers={**staff, **key})
    assert r.status_code == 200, r.text
    c = r.json()
    assert state_of(c) == "COMPLETED" and "payment" not in c
    # The same request again (the receptionist's retry) is the same booking; the key with another request is refused.
    again = await http.post("/v1/checkouts:createForCustomer", json=body, headers={**staff, **key})
    assert again.status_code == 200 and again.json()["id"] == c["id"], again.text
    reused = await http.post("/v1/checkouts:createForCustomer", json={**body, "settlement": LINK}, headers={**staff, **key})
    assert (reused.status_code, reused.json()["type"]) == (422, "idempotency-key-reused"), reused.text
    b = c["staffBooking"]
    assert b["settlement"] == VENUE and b["customerId"] == customer_sub and b["createdBy"].startswith("staff:")
    assert b["venuePayment"]["status"] == "unpaid" and not b["venuePayment"].get("reference")

    # The customer's own list shows it.
    mine = (await http.get("/v1/checkouts", headers=auth("customer", sub=customer_sub))).json()["checkouts"]
    assert [x["id"] for x in mine] == [c["id"]]

    paid = {"method": "VENUE_PAYMENT_METHOD_CASH", "amount": {"currencyCode": "TRY", "amountMinor": "75000"},
            "reference": "receipt 0042"}
    r = await http.post(f"/v1/checkouts/{c['id']}:markPaid", json={**paid, "method": "CASHISH"}, headers=staff)
    assert r.status_code == 400, r.text
    r = await http.post(f"/v1/checkouts/{c['id']}:markPaid", json={**paid, "reference": ""}, headers=staff)
    assert (r.status_code, r.json().get("field")) == (400, "reference"), r.text
    r = await http.post(f"/v1/checkouts/{c['id']}:markPaid", json=paid, headers=other_merchant_staff())
    assert r.status_code == 404
    r = await http.post(f"/v1/checkouts/{c['id']}:markPaid", json=paid, headers=auth("customer", sub=customer_sub))
    assert r.status_code == 403
    r = await http.post(f"/v1/checkouts/{c['id']}:markPaid", json=paid, headers=staff)
    assert r.status_code == 200, r.text
    v = r.json()["staffBooking"]["venuePayment"]
    assert v["status"] == "paid" and v["method"] == "VENUE_PAYMENT_METHOD_CASH" and v["reference"] == "receipt 0042"
    assert v["amount"] == {"currencyCode": "TRY", "amountMinor": "75000"}
    # The same again is the same answer; another payment is refused.
    again = await http.post(f"/v1/checkouts/{c['id']}:markPaid", json=paid, headers=staff)
    assert again.status_code == 200 and again.json()["staffBooking"]["venuePayment"]["paidTime"] == v["paidTime"]
    r = await http.post(f"/v1/checkouts/{c['id']}:markPaid", json={**paid, "reference": "other"}, headers=staff)
    assert (r.status_code, r.json()["type"]) == (409, "already-paid"), r.text

    assert await _events(stack, c["id"]) == ["booking.created_by_staff", "checkout.completed", "booking.confirmed",
                                             "booking.paid_at_venue"]


async def test_payment_link_paid_by_the_customer_on_the_hosted_page(http, auth, fresh_key, new_slots, stack):
    slot = (await new_slots(1, days_ahead=4))[0]
    staff = auth("staff")
    contact = {"name": "Ayşe Caller", "phone": "+905321234567"}
    for bad, field in (({**contact, "phone": "0532 123 45 67"}, "contact.phone"),
                       ({"name": "x", "email": "a@b"}, "contact.email"),
                       ({"phone": "+905321234567"}, "contact.name")):
        r = await http.post("/v1/checkouts:createForCustomer", headers={**staff, **fresh_key()},
                            json={"slotId": slot["id"], "contact": bad, "settlement": LINK})
        assert (r.status_code, r.json().get("field")) == (400, field), (bad, r.text)

    r = await http.post("/v1/checkouts:createForCustomer", headers={**staff, **fresh_key()},
                        json={"slotId": slot["id"], "contact": contact, "settlement": LINK, "linkTtlSeconds": 600})
    assert r.status_code == 200, r.text
    c = r.json()
    b = c["staffBooking"]
    assert state_of(c) == "AWAITING_ACTION" and b["settlement"] == LINK and b["customerId"].startswith("guest:")
    assert "/pay/pi_" in b["linkUrl"] and not c["payment"].get("clientSecret")
    expire = dt.datetime.fromisoformat(b["linkExpireTime"].replace("Z", "+00:00"))
    assert 590 < (expire - dt.datetime.now(dt.timezone.utc)).total_seconds() <= 600

    async with httpx.AsyncClient(timeout=10) as browser:
        page = await browser.get(b["linkUrl"])
        assert page.status_code == 200 and "pm_card_ok" in page.text
        paid = await browser.post(b["linkUrl"], data={"payment_method": "pm_card_ok"})
        assert paid.status_code == 200 and paid.json()["status"] == "succeeded", paid.text
    done = await _until(http, c["id"], staff, {"COMPLETED"})
    assert state_of(done) == "COMPLETED" and done["payment"]["status"] == "PAYMENT_STATUS_SUCCEEDED"
    assert await _events(stack, c["id"]) == ["booking.created_by_staff", "checkout.completed", "booking.confirmed"]

    # The same contact is the same guest customer.
    second = (await new_slots(1, days_ahead=4))[0]
    r = await http.post("/v1/checkouts:createForCustomer", headers={**staff, **fresh_key()},
                        json={"slotId": second["id"], "contact": contact, "settlement": VENUE})
    assert r.status_code == 200 and r.json()["staffBooking"]["customerId"] == b["customerId"], r.text


async def test_an_expired_link_releases_the_hold(http, auth, fresh_key, new_slots):
    slot = (await new_slots(1, days_ahead=5))[0]
    staff = auth("staff")
    r = await http.post("/v1/checkouts:createForCustomer", headers={**staff, **fresh_key()},
                        json={"slotId": slot["id"], "customerId": "customer-late", "settlement": LINK,
                              "linkTtlSeconds": 2})
    assert r.status_code == 200, r.text
    c = r.json()
    link = c["staffBooking"]["linkUrl"]
    # Meanwhile the time is held: nobody else gets it.
    r = await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**auth("customer"), **fresh_key()})
    assert r.status_code == 409
    ended = await _until(http, c["id"], staff, {"EXPIRED"})
    assert state_of(ended) == "EXPIRED" and ended["payment"]["status"] == "PAYMENT_STATUS_CANCELED"
    assert not ended["staffBooking"].get("linkUrl")
    async with httpx.AsyncClient(timeout=10) as browser:  # the link no longer takes money
        late = await browser.post(link, data={"payment_method": "pm_card_ok"})
        assert late.status_code == 409
    r = await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**auth("customer"), **fresh_key()})
    assert r.status_code == 200 and state_of(r.json()) == "HELD", r.text


async def test_no_show_only_from_the_start(http, auth, fresh_key, salon, stack):
    slot = await _slot_starting_in(http, auth, salon, 4)
    staff = auth("staff")
    r = await http.post("/v1/checkouts:createForCustomer", headers={**staff, **fresh_key()},
                        json={"slotId": slot["id"], "customerId": f"customer-{uuid.uuid4().hex[:8]}",
                              "settlement": VENUE})
    assert r.status_code == 200 and state_of(r.json()) == "COMPLETED", r.text
    cid = r.json()["id"]
    r = await http.post(f"/v1/checkouts/{cid}:markNoShow", json={}, headers=staff)
    assert (r.status_code, r.json()["type"]) == (409, "outside-no-show-window"), r.text
    start = dt.datetime.fromisoformat(slot["startTime"].replace("Z", "+00:00"))
    await asyncio.sleep(max(0.0, (start - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.5)
    r = await http.post(f"/v1/checkouts/{cid}:markNoShow", json={}, headers=other_merchant_staff())
    assert r.status_code == 404
    r = await http.post(f"/v1/checkouts/{cid}:markNoShow", json={}, headers=staff)
    assert r.status_code == 200, r.text
    b = r.json()["staffBooking"]
    assert b["noShowTime"] and b["noShowBy"].startswith("staff:") and b["customerNoShows"] == 1
    # A no-show did not pay at the desk.
    r = await http.post(f"/v1/checkouts/{cid}:markPaid", headers=staff, json={
        "method": "VENUE_PAYMENT_METHOD_CARD_TERMINAL", "amount": {"currencyCode": "TRY", "amountMinor": "75000"},
        "reference": "t-1"})
    assert (r.status_code, r.json()["type"]) == (409, "no-show"), r.text
    assert (await _events(stack, cid))[-1] == "booking.no_show"


async def test_no_show_not_after_a_day(http, auth, fresh_key, new_slots, stack):
    """The window's end is the database's: a booking whose start is 24 h past refuses a no-show."""
    slot = (await new_slots(1, days_ahead=6))[0]
    staff = auth("staff")
    r = await http.post("/v1/checkouts:createForCustomer", headers={**staff, **fresh_key()},
                        json={"slotId": slot["id"], "customerId": "customer-old", "settlement": VENUE})
    assert r.status_code == 200, r.text
    cid = r.json()["id"]
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:  # the appointment, as far as the checkout knows, began a day and a minute ago
        await db.execute("UPDATE checkouts SET start_time = clock_timestamp() - interval '24 hours 1 minute' "
                         "WHERE id = $1", uuid.UUID(cid))
        r = await http.post(f"/v1/checkouts/{cid}:markNoShow", json={}, headers=staff)
        assert (r.status_code, r.json()["type"]) == (409, "outside-no-show-window"), r.text
        assert await db.fetchval("SELECT no_show_at FROM checkouts WHERE id = $1", uuid.UUID(cid)) is None
    finally:
        await db.close()
