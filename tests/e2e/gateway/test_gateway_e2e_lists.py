"""Through the gateway over HTTP: a customer's list of their purchases
(GET /v1/checkouts) and a salon's agenda for its staff (GET /v1/salons/{id}/bookings)."""
import datetime as dt
import uuid
from zoneinfo import ZoneInfo

from tests.e2e.gateway.conftest import state_of


async def test_a_customers_list_after_two_purchases_and_the_staffs_agenda(http, auth, fresh_key, new_slots,
                                                                          new_product, until_state, salon):
    sub = f"lister-{uuid.uuid4().hex[:8]}"
    me = auth("customer", sub)
    slot = (await new_slots(1, days_ahead=2))[0]
    product, _ = await new_product(3)
    bought = []
    for body in ({"slotId": slot["id"]}, {"productId": product["id"], "quantity": 1}):
        co = (await http.post("/v1/checkouts", json=body, headers={**me, **fresh_key()})).json()
        paid = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                               headers={**me, **fresh_key()})
        assert paid.status_code == 200, paid.text
        assert state_of(await until_state(co["id"], me)) == "COMPLETED"
        bought.append(co["id"])

    r = await http.get("/v1/checkouts", headers=me)
    assert r.status_code == 200, r.text
    listed = r.json()["checkouts"]
    assert [c["id"] for c in listed] == list(reversed(bought))  # newest first, only mine
    assert all(state_of(c) == "COMPLETED" and c["codes"] == [] and c["payment"]["clientSecret"] == ""
               for c in listed)
    assert listed[1]["salonId"] == salon and listed[0]["productId"] == product["id"]
    # paged: one at a time, the token carries on
    first = (await http.get("/v1/checkouts", params={"pageSize": 1}, headers=me)).json()
    second = (await http.get("/v1/checkouts", params={"pageSize": 1, "pageToken": first["nextPageToken"]},
                             headers=me)).json()
    assert [c["id"] for c in first["checkouts"] + second["checkouts"]] == list(reversed(bought))
    # filters are query parameters; a bad one is a 400 naming it
    booked = (await http.get("/v1/checkouts", params={"salonId": salon, "state": "CHECKOUT_STATE_COMPLETED"},
                             headers=me)).json()["checkouts"]
    assert [c["id"] for c in booked] == [bought[0]]
    bad = await http.get("/v1/checkouts", params={"createdAfter": "2026-02-01T00:00:00Z",
                                                  "createdBefore": "2026-01-01T00:00:00Z"}, headers=me)
    assert bad.status_code == 400 and bad.json()["field"] == "createdBefore", bad.text
    unknown = await http.get("/v1/checkouts", params={"state": "CHECKOUT_STATE_BOGUS"}, headers=me)
    assert unknown.status_code == 400 and unknown.json()["field"] == "state", unknown.text
    # the merchant's staff find it in their list, filtered by the salon
    staff = auth("staff")
    mine = (await http.get("/v1/checkouts", params={"salonId": salon, "pageSize": 500}, headers=staff)).json()
    assert bought[0] in {c["id"] for c in mine["checkouts"]}

    # the salon's agenda on the day of the slot (Istanbul's wall clock) shows the confirmed booking
    day = dt.datetime.fromisoformat(slot["startTime"].replace("Z", "+00:00")).astimezone(ZoneInfo("Europe/Istanbul"))
    r = await http.get(f"/v1/salons/{salon}/bookings", params={"day": day.date().isoformat(), "pageSize": 500},
                       headers=staff)
    assert r.status_code == 200, r.text
    (entry,) = [b for b in r.json()["bookings"] if b["slotId"] == slot["id"]]
    assert entry["status"] == "HOLD_STATUS_CONFIRMED" and entry["customerId"] == sub and entry["paymentRef"]
    assert entry["localStartTime"].endswith("+03:00") and entry["resourceId"] == slot["resourceId"]
    missing = await http.get(f"/v1/salons/{salon}/bookings", headers=staff)
    assert missing.status_code == 400 and missing.json()["field"] == "day", missing.text
    assert (await http.get(f"/v1/salons/{salon}/bookings", params={"day": day.date().isoformat()},
                           headers=me)).status_code == 403
