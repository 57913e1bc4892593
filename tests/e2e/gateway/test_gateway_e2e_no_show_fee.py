"""The no-show fee over HTTP, through the real stack (gateway, payments, booking and the PSP
simulator as processes; docs/checkout.md, "No-show fee"): the salon's policy names the fee on its
slots, the customer accepts exactly that amount when paying, and when staff mark a no-show the fee
is charged off-session on the saved card once (the PSP's ledger says so), or declined with a clear
state; without an acceptance nothing is ever charged."""
import asyncio
import datetime as dt
import uuid

import asyncpg
import httpx

from cutylib.config import with_database

PRICE, PERCENT, FEE = 75000, 20, 15000


def state_of(checkout: dict) -> str:
    return checkout["state"].removeprefix("CHECKOUT_STATE_")


async def _salon_with_fee(http, auth) -> str:
    r = await http.post("/v1/salons", headers=auth("admin"), json={
        "name": "No-show fee salon", "timeZone": "Europe/Istanbul", "noShowFeePercent": PERCENT})
    assert r.status_code == 200 and r.json()["noShowFeePercent"] == PERCENT, r.text
    return r.json()["id"]


async def _slots_starting_in(http, auth, salon: str, seconds: float, n: int) -> list[dict]:
    admin = auth("admin")
    start = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    slots = []
    for _ in range(n):
        res = await http.post(f"/v1/salons/{salon}/resources", json={"name": f"chair {uuid.uuid4().hex[:6]}"},
                              headers=admin)
        slots.append({"resourceId": res.json()["id"], "startTime": start.isoformat(),
                      "endTime": (start + dt.timedelta(hours=1)).isoformat(),
                      "price": {"currencyCode": "TRY", "amountMinor": str(PRICE)}})
    r = await http.post(f"/v1/salons/{salon}/slots:batchCreate", headers=admin, json={"slots": slots})
    assert r.status_code == 200, r.text
    return r.json()["slots"]


def _money(minor: int) -> dict:
    return {"currencyCode": "TRY", "amountMinor": str(minor)}


async def _buy_in_one_call(http, customer: dict, fresh_key, slot_id: str, card: str, accept: int) -> dict:
    r = await http.post("/v1/checkouts", headers={**customer, **fresh_key()}, json={
        "slotId": slot_id, "paymentMethod": card, "acceptNoShowFee": _money(accept)})
    assert r.status_code == 200 and state_of(r.json()) == "COMPLETED", r.text
    return r.json()


async def _buy(http, customer: dict, fresh_key, slot_id: str, card: str, accept: int | None) -> dict:
    r = await http.post("/v1/checkouts", json={"slotId": slot_id}, headers={**customer, **fresh_key()})
    assert r.status_code == 200, r.text
    body = {"paymentMethod": card}
    if accept is not None:
        body["acceptNoShowFee"] = {"currencyCode": "TRY", "amountMinor": str(accept)}
    r = await http.post(f"/v1/checkouts/{r.json()['id']}:pay", json=body, headers={**customer, **fresh_key()})
    assert r.status_code == 200 and state_of(r.json()) == "COMPLETED", r.text
    return r.json()


async def _fee_decided(http, checkout_id: str, staff: dict, timeout: float = 30) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        c = (await http.get(f"/v1/checkouts/{checkout_id}", headers=staff)).json()
        if c.get("noShowFee", {}).get("status") in ("charged", "declined") or asyncio.get_running_loop().time() > deadline:
            return c
        await asyncio.sleep(0.2)


async def _events(stack, checkout_id: str) -> list[str]:
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        rows = await db.fetch("SELECT type FROM merchant_events WHERE checkout_id = $1 ORDER BY created_at",
                              uuid.UUID(checkout_id))
    finally:
        await db.close()
    return [r["type"] for r in rows]


async def _ledger(stack) -> dict:
    async with httpx.AsyncClient(base_url=stack.env["CUTY_PSP_URL"], timeout=10) as psp:
        return (await psp.get("/v1/_ledger")).json()


async def test_an_accepted_fee_is_charged_off_session_once_and_a_declined_one_says_so(http, auth, fresh_key, stack):
    salon = await _salon_with_fee(http, auth)
    paid, declined, unaccepted = await _slots_starting_in(http, auth, salon, 8, 3)
    # The salon's policy names the fee on its slots.
    now = dt.datetime.now(dt.timezone.utc)
    window = {"startTime": (now - dt.timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
              "endTime": (now + dt.timedelta(hours=1)).isoformat().replace("+00:00", "Z")}
    listed = (await http.get(f"/v1/salons/{salon}/slots", params=window, headers=auth("customer"))).json()
    assert {s["id"]: s["noShowFee"] for s in listed["slots"]}[paid["id"]] == {
        "currencyCode": "TRY", "amountMinor": str(FEE)}

    customer = auth("customer", f"customer-{uuid.uuid4().hex[:8]}")
    # Accepting another amount than the policy's is refused and changes nothing (still HELD).
    r = await http.post("/v1/checkouts", json={"slotId": paid["id"]}, headers={**customer, **fresh_key()})
    held = r.json()["id"]
    r = await http.post(f"/v1/checkouts/{held}:pay", headers={**customer, **fresh_key()}, json={
        "paymentMethod": "pm_card_ok", "acceptNoShowFee": {"currencyCode": "TRY", "amountMinor": "10000"}})
    assert (r.status_code, r.json()["type"]) == (409, "no-show-fee-changed"), r.text
    r = await http.post(f"/v1/checkouts/{held}:pay", headers={**customer, **fresh_key()}, json={
        "paymentMethod": "pm_card_ok", "acceptNoShowFee": {"currencyCode": "TRY", "amountMinor": "-5"}})
    assert (r.status_code, r.json()["field"]) == (400, "acceptNoShowFee.amountMinor"), r.text
    assert state_of((await http.get(f"/v1/checkouts/{held}", headers=customer)).json()) == "HELD"
    r = await http.post(f"/v1/checkouts/{held}:pay", headers={**customer, **fresh_key()}, json={
        "paymentMethod": "pm_card_ok", "acceptNoShowFee": {"currencyCode": "TRY", "amountMinor": str(FEE)}})
    assert r.status_code == 200 and state_of(r.json()) == "COMPLETED", r.text
    bought = r.json()
    # The acceptance is recorded with the checkout and shown in its answer.
    assert bought["noShowFee"]["amount"] == {"currencyCode": "TRY", "amountMinor": str(FEE)}
    assert bought["noShowFee"]["acceptTime"] and bought["noShowFee"]["status"] == ""
    # A one-call purchase accepts it too, only with its payment.
    r = await http.post("/v1/checkouts", json={"slotId": declined["id"], "acceptNoShowFee": _money(FEE)},
                        headers={**customer, **fresh_key()})
    assert (r.status_code, r.json()["field"]) == (400, "acceptNoShowFee"), r.text
    r = await http.post("/v1/checkouts", headers={**customer, **fresh_key()}, json={
        "slotId": declined["id"], "paymentMethod": "pm_card_ok", "acceptNoShowFee": _money(FEE + 1)})
    assert (r.status_code, r.json()["type"]) == (409, "no-show-fee-changed"), r.text
    other = await _buy_in_one_call(http, customer, fresh_key, declined["id"], "pm_card_off_session_declined", FEE)
    assert other["noShowFee"]["amount"] == _money(FEE)
    plain = await _buy(http, customer, fresh_key, unaccepted["id"], "pm_card_ok", None)
    assert "noShowFee" not in plain

    start = dt.datetime.fromisoformat(paid["startTime"].replace("Z", "+00:00"))
    await asyncio.sleep(max(0.0, (start - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.5)
    staff = auth("staff")
    for c in (bought, other, plain):
        r = await http.post(f"/v1/checkouts/{c['id']}:markNoShow", json={}, headers=staff)
        assert r.status_code == 200, r.text

    charged = await _fee_decided(http, bought["id"], staff)
    fee = charged["noShowFee"]
    assert fee["status"] == "charged" and fee["paymentId"], charged
    # The purchase's payment stays the checkout's; the fee is its own payment.
    assert charged["payment"]["id"] != fee["paymentId"]
    # The staff see the customer's no-shows at their merchant (all three); the customer does not.
    assert charged["staffBooking"]["customerNoShows"] == 3
    mine = (await http.get(f"/v1/checkouts/{bought['id']}", headers=customer)).json()
    assert mine["staffBooking"]["customerNoShows"] == 0 and mine["noShowFee"]["status"] == "charged"
    refused = await _fee_decided(http, other["id"], staff)
    assert refused["noShowFee"]["status"] == "declined" and refused["noShowFee"]["failureReason"], refused
    unfeed = (await http.get(f"/v1/checkouts/{plain['id']}", headers=staff)).json()
    assert "noShowFee" not in unfeed and unfeed["staffBooking"]["noShowTime"]

    # Marking again is the same no-show: nothing is charged twice.
    r = await http.post(f"/v1/checkouts/{bought['id']}:markNoShow", json={}, headers=staff)
    assert r.status_code == 200 and r.json()["noShowFee"]["status"] == "charged", r.text
    ledger = await _ledger(stack)
    keys = {c["id"]: f"no-show-fee:{c['id']}" for c in (bought, other, plain)}
    fees = [c for c in ledger["charges"] if c["idempotency_key"] in keys.values()]
    assert [(c["idempotency_key"], c["amount"], c["off_session"]) for c in fees] == [
        (keys[bought["id"]], FEE, True)]
    assert ledger["charge_count_by_key"][keys[bought["id"]]] == 1

    # On the timeline and in the merchant's events.
    assert (await _events(stack, bought["id"]))[-2:] == ["booking.no_show", "booking.no_show_fee_charged"]
    assert (await _events(stack, other["id"]))[-2:] == ["booking.no_show", "booking.no_show_fee_declined"]
    assert (await _events(stack, plain["id"]))[-1] == "booking.no_show"
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        timeline = await db.fetch("SELECT source, to_status FROM payment_events WHERE checkout_id = $1 ORDER BY seq",
                                  uuid.UUID(bought["id"]))
    finally:
        await db.close()
    assert ("no_show_fee", "charged") in [(e["source"], e["to_status"]) for e in timeline]


async def test_a_staff_cancel_after_a_no_show_keeps_the_fee_unless_staff_refund_it(http, auth, fresh_key, stack,
                                                                                  until_state):
    """The fee is for not coming: cancelling the booking afterwards gives back what is left of the
    purchase, never the fee's own payment, even when the purchase alone no longer covers the
    booking's price; staff refund the fee only by asking for that payment's refund themselves."""
    salon = await _salon_with_fee(http, auth)
    (slot,) = await _slots_starting_in(http, auth, salon, 8, 1)
    customer = auth("customer", f"customer-{uuid.uuid4().hex[:8]}")
    bought = await _buy(http, customer, fresh_key, slot["id"], "pm_card_ok", FEE)
    start = dt.datetime.fromisoformat(slot["startTime"].replace("Z", "+00:00"))
    await asyncio.sleep(max(0.0, (start - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.5)
    staff = auth("staff")
    r = await http.post(f"/v1/checkouts/{bought['id']}:markNoShow", json={}, headers=staff)
    assert r.status_code == 200, r.text
    fee = (await _fee_decided(http, bought["id"], staff))["noShowFee"]
    assert fee["status"] == "charged", fee
    # The salon gave part of the purchase back already: what is left of it (65000) is less than the
    # price (75000), so a cancel that counted the fee's payment would take the rest from the fee.
    purchase = bought["payment"]["id"]
    r = await http.post(f"/v1/payments/{purchase}:refund", headers={**staff, **fresh_key()},
                        json={"amount": _money(10000), "reason": "the colour was not as asked"})
    assert r.status_code == 200, r.text

    r = await http.post(f"/v1/checkouts/{bought['id']}:cancel", headers=staff,
                        json={"reason": "the customer called: they will not come again"})
    assert r.status_code == 200, r.text
    out = await until_state(bought["id"], staff, {"CANCELLED_AFTER_PURCHASE"})
    assert out["refundAmount"] == _money(PRICE - 10000), out
    assert out["payment"]["status"] == "PAYMENT_STATUS_REFUNDED"
    # The fee stays charged, its payment untouched, at the PSP too.
    assert out["noShowFee"]["status"] == "charged" and out["noShowFee"]["paymentId"] == fee["paymentId"]
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        fee_payment = await db.fetchrow("SELECT status, refunded_minor, psp_intent_id FROM payments WHERE id = $1",
                                        uuid.UUID(fee["paymentId"]))
    finally:
        await db.close()
    assert (fee_payment["status"], fee_payment["refunded_minor"]) == ("succeeded", 0)
    ledger = await _ledger(stack)
    assert not [x for x in ledger["refunds"] if x["intent_id"] == fee_payment["psp_intent_id"]]

    # Asked for explicitly, the fee is refunded like any payment.
    r = await http.post(f"/v1/payments/{fee['paymentId']}:refund", headers={**staff, **fresh_key()},
                        json={"reason": "waived: a family emergency"})
    assert r.status_code == 200 and r.json()["amount"] == _money(FEE), r.text
    ledger = await _ledger(stack)
    assert [x["amount"] for x in ledger["refunds"] if x["intent_id"] == fee_payment["psp_intent_id"]] == [FEE]


async def test_a_payment_link_offers_the_fee_on_the_psp_page_and_only_an_accepted_one_is_charged(
        http, auth, fresh_key, stack, until_state):
    """A phone booking: staff make a payment link; the PSP's hosted page names the salon's no-show
    fee and asks the customer to accept it. An acceptance of another amount is refused (409) and
    changes nothing; the customer who accepts it has it recorded with the checkout as a customer's
    own acceptance is, and charged once off-session on the card they presented when staff mark a
    no-show; a customer who pays without accepting is never charged a fee."""
    salon = await _salon_with_fee(http, auth)
    accepting, refusing = await _slots_starting_in(http, auth, salon, 15, 2)
    staff = auth("staff")
    links = {}
    for name, slot in (("accepting", accepting), ("refusing", refusing)):
        r = await http.post("/v1/checkouts:createForCustomer", headers={**staff, **fresh_key()}, json={
            "slotId": slot["id"], "contact": {"name": f"Caller {name}", "phone": f"+90532{uuid.uuid4().int % 10**7:07d}"},
            "settlement": "SETTLEMENT_PAYMENT_LINK"})
        assert r.status_code == 200 and state_of(r.json()) == "AWAITING_ACTION", r.text
        assert "noShowFee" not in r.json()  # nothing is accepted by staff
        links[name] = r.json()

    async with httpx.AsyncClient(timeout=10) as browser:
        url = links["accepting"]["staffBooking"]["linkUrl"]
        page = (await browser.get(url)).text
        assert f'name="accept_off_session_amount" value="{FEE}"' in page and f"{FEE} TRY" in page
        r = await browser.post(url, data={"payment_method": "pm_card_ok", "accept_off_session_amount": str(FEE - 1)})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "off_session_consent_changed"), r.text
        seen = (await http.get(f"/v1/checkouts/{links['accepting']['id']}", headers=staff)).json()
        assert state_of(seen) == "AWAITING_ACTION" and "noShowFee" not in seen
        r = await browser.post(url, data={"payment_method": "pm_card_ok", "accept_off_session_amount": str(FEE)})
        assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
        r = await browser.post(links["refusing"]["staffBooking"]["linkUrl"], data={"payment_method": "pm_card_ok"})
        assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text

    bought = await until_state(links["accepting"]["id"], staff, {"COMPLETED"})
    assert bought["noShowFee"]["amount"] == _money(FEE) and bought["noShowFee"]["acceptTime"], bought
    plain = await until_state(links["refusing"]["id"], staff, {"COMPLETED"})
    assert "noShowFee" not in plain
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        row = await db.fetchrow("SELECT no_show_fee_minor, no_show_fee_accepted_at, no_show_fee_offered_minor "
                                "FROM checkouts WHERE id = $1", uuid.UUID(bought["id"]))
        notes = [r["note"] for r in await db.fetch("SELECT note FROM payment_events WHERE checkout_id = $1",
                                                     uuid.UUID(bought["id"]))]
    finally:
        await db.close()
    assert (row["no_show_fee_minor"], row["no_show_fee_offered_minor"]) == (FEE, FEE) and row["no_show_fee_accepted_at"]
    assert any("accepted on the payment page" in n for n in notes), notes

    start = dt.datetime.fromisoformat(accepting["startTime"].replace("Z", "+00:00"))
    await asyncio.sleep(max(0.0, (start - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.5)
    for c in (bought, plain):
        r = await http.post(f"/v1/checkouts/{c['id']}:markNoShow", json={}, headers=staff)
        assert r.status_code == 200, r.text
    charged = await _fee_decided(http, bought["id"], staff)
    assert charged["noShowFee"]["status"] == "charged", charged
    unfeed = (await http.get(f"/v1/checkouts/{plain['id']}", headers=staff)).json()
    assert "noShowFee" not in unfeed and unfeed["staffBooking"]["noShowTime"]
    ledger = await _ledger(stack)
    fees = [(c["idempotency_key"], c["amount"], c["off_session"]) for c in ledger["charges"]
            if c["idempotency_key"] in (f"no-show-fee:{bought['id']}", f"no-show-fee:{plain['id']}")]
    assert fees == [(f"no-show-fee:{bought['id']}", FEE, True)]
    assert (await _events(stack, bought["id"]))[-2:] == ["booking.no_show", "booking.no_show_fee_charged"]
