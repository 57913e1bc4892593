"""Full purchases over HTTP through the gateway: a slot, N codes, 3-D Secure, decline, cancel."""
import httpx


def state_of(checkout: dict) -> str:
    return checkout["state"].removeprefix("CHECKOUT_STATE_")


async def test_full_booking_purchase(http, auth, fresh_key, new_slots, until_state, salon):
    slots = await new_slots(4)
    me = auth("customer")
    listed = await http.get(f"/v1/salons/{salon}/slots", headers=me, params={
        "startTime": slots[0]["startTime"], "endTime": slots[-1]["endTime"], "availableOnly": "true"})
    assert listed.status_code == 200, listed.text
    assert {s["id"] for s in slots} <= {s["id"] for s in listed.json()["slots"]}
    assert all(s["localStartTime"].endswith("+03:00") for s in listed.json()["slots"])

    r = await http.post("/v1/checkouts", json={"slotId": slots[0]["id"]}, headers={**me, **fresh_key()})
    assert r.status_code == 200, r.text
    co = r.json()
    assert state_of(co) == "HELD" and co["kind"].endswith("BOOKING")
    assert co["amount"] == {"currencyCode": "TRY", "amountMinor": "75000"}  # from the slot, never the client
    assert co["holdId"] and co["expireTime"].endswith("Z")

    # The loser of the race is told at once and offered alternatives.
    lost = await http.post("/v1/checkouts", json={"slotId": slots[0]["id"]}, headers={**auth("customer"), **fresh_key()})
    assert lost.status_code == 409 and lost.headers["content-type"] == "application/problem+json"
    p = lost.json()
    assert p["type"] == "slot-unavailable" and 1 <= len(p["alternatives"]) <= 3
    assert {a["id"] for a in p["alternatives"]} <= {s["id"] for s in slots[1:]} | {a["id"] for a in p["alternatives"]}
    assert all("startTime" in a and "price" in a for a in p["alternatives"])

    paid = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"}, headers={**me, **fresh_key()})
    assert paid.status_code == 200, paid.text
    done = await until_state(co["id"], me)
    assert state_of(done) == "COMPLETED"
    assert "nextAction" not in done["payment"] and done["payment"]["clientSecret"] == ""

    staff = auth("staff")
    assert (await http.get(f"/v1/checkouts/{co['id']}", headers=staff)).json()["id"] == co["id"]
    events = (await http.get(f"/v1/payments/{done['payment']['id']}/events", headers=staff)).json()["events"]
    assert events and any(e["toStatus"].lower().endswith("succeeded") for e in events)
    after = await http.get(f"/v1/salons/{salon}/slots", headers=me, params={
        "startTime": slots[0]["startTime"], "endTime": slots[-1]["endTime"], "availableOnly": "true"})
    assert slots[0]["id"] not in {s["id"] for s in after.json()["slots"]}


async def test_3ds_shows_the_action_only_while_needed(http, auth, fresh_key, new_slots, until_state):
    slot = (await new_slots(1))[0]
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**me, **fresh_key()})).json()
    r = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_3ds"}, headers={**me, **fresh_key()})
    assert r.status_code == 200, r.text
    waiting = await until_state(co["id"], me, {"AWAITING_ACTION"})
    url = waiting["payment"]["nextAction"]["redirectUrl"]
    async with httpx.AsyncClient(timeout=10) as psp:
        assert (await psp.get(url)).status_code < 400
    done = await until_state(co["id"], me)
    assert state_of(done) == "COMPLETED"
    assert "nextAction" not in done["payment"] and done["payment"]["clientSecret"] == ""


async def test_declined_payment_releases_the_slot(http, auth, fresh_key, new_slots, until_state):
    slot = (await new_slots(1))[0]
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**me, **fresh_key()})).json()
    await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_declined"}, headers={**me, **fresh_key()})
    assert state_of(await until_state(co["id"], me)) == "FAILED"
    again = await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**auth("customer"), **fresh_key()})
    assert again.status_code == 200, again.text


async def test_cancel(http, auth, fresh_key, new_slots, until_state):
    slot = (await new_slots(1))[0]
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**me, **fresh_key()})).json()
    r = await http.post(f"/v1/checkouts/{co['id']}:cancel", headers=me)
    assert r.status_code == 200, r.text
    assert state_of(await until_state(co["id"], me)) == "CANCELLED"


async def test_full_code_purchase(http, auth, fresh_key, new_product, until_state):
    product, values = await new_product(3)
    staff, admin, me = auth("staff"), auth("admin"), auth("customer")
    stock = (await http.get(f"/v1/products/{product['id']}/stock", headers=staff)).json()
    assert stock["available"] == "3"  # int64 as a string (proto3 JSON)
    co = (await http.post("/v1/checkouts", json={"productId": product["id"], "quantity": 2}, headers={**me, **fresh_key()})).json()
    assert state_of(co) == "HELD" and co["amount"] == {"currencyCode": "TRY", "amountMinor": "20000"}
    r = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"}, headers={**me, **fresh_key()})
    assert r.status_code == 200, r.text
    done = await until_state(co["id"], me)
    assert state_of(done) == "COMPLETED"
    got = [c["value"] for c in done["codes"]]
    assert len(got) == 2 and set(got) <= set(values)
    # Staff see the checkout but never the code values; the list is masked.
    seen_by_staff = (await http.get(f"/v1/checkouts/{co['id']}", headers=staff)).json()
    assert not any(c.get("value") for c in seen_by_staff.get("codes", []))
    listed = (await http.get(f"/v1/products/{product['id']}/codes", headers=staff)).json()["codes"]
    assert len(listed) == 3 and all(c["maskedValue"][-4:] in {v[-4:] for v in values} for c in listed)
    assert not any(c["maskedValue"] in values for c in listed)
    stock = (await http.get(f"/v1/products/{product['id']}/stock", headers=staff)).json()
    assert (stock.get("available", "0"), stock.get("delivered", "0")) == ("1", "2")
    revealed = await http.post(f"/v1/codes/{listed[0]['id']}:reveal", headers=admin)
    assert revealed.status_code == 200 and revealed.json()["value"] in values
    # Short stock: 409 with the available count.
    short = await http.post("/v1/checkouts", json={"productId": product["id"], "quantity": 5}, headers={**me, **fresh_key()})
    assert short.status_code == 409, short.text
    assert short.json()["type"] == "out-of-stock" and short.json()["available"] == 1


async def test_a_free_slot_is_booked_without_a_payment(http, auth, fresh_key, salon, until_state):
    """A zero price completes, with no PSP call, and the timeline says so."""
    import datetime as dt
    import uuid

    admin, me = auth("admin"), auth("customer", f"c-{uuid.uuid4().hex[:8]}")
    chair = (await http.post(f"/v1/salons/{salon}/resources", json={"name": "free chair"}, headers=admin)).json()
    start = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(days=3)
    made = await http.post(f"/v1/salons/{salon}/slots:batchCreate", headers=admin, json={"slots": [{
        "resourceId": chair["id"], "startTime": start.isoformat(), "endTime": (start + dt.timedelta(hours=1)).isoformat(),
        "price": {"currencyCode": "TRY", "amountMinor": "0"}}]})
    assert made.status_code == 200, made.text
    co = (await http.post("/v1/checkouts", json={"slotId": made.json()["slots"][0]["id"]},
                          headers={**me, **fresh_key()})).json()
    paid = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                           headers={**me, **fresh_key()})
    assert paid.status_code == 200, paid.text
    done = await until_state(co["id"], me)
    assert state_of(done) == "COMPLETED" and not done.get("payment")



async def test_answers_carry_zeros_and_false(http, auth, new_product):
    """Unpopulated fields are written (grpc-gateway's EmitUnpopulated)."""
    product, _ = await new_product(2)
    stock = await http.get(f"/v1/products/{product['id']}/stock", headers=auth("staff"))
    assert stock.status_code == 200, stock.text
    assert stock.json() == {"productId": product["id"], "available": "2", "reserved": "0", "delivered": "0",
                            "quarantined": "0", "revoked": "0"}
    doc = (await http.get("/openapi.json")).json()
    schema = doc["components"]["schemas"]["cuty.codepool.v1.Stock"]
    assert set(schema["x-cuty-always-in-answers"]) == {"productId", "available", "reserved", "delivered",
                                                       "quarantined", "revoked"}
    assert schema["properties"]["reserved"]["default"] == "0"
