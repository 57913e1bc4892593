"""A salon's real day over HTTP: an admin defines a service and working hours, a customer asks the
free times and checks out a service time with any free stylist; the buyer who loses the time keeps
an alternative held for them and takes it with one call (docs/booking.md)."""
from datetime import datetime, timedelta, timezone



def state_of(checkout: dict) -> str:
    return checkout["state"].removeprefix("CHECKOUT_STATE_")


async def _service_salon(http, auth, stylists: int = 1) -> tuple[str, list[str], dict]:
    admin = auth("admin")
    salon = (await http.post("/v1/salons", json={"name": "Day salon", "timeZone": "Europe/Berlin"},
                             headers=admin)).json()["id"]
    rs = [(await http.post(f"/v1/salons/{salon}/resources", json={"name": f"stylist {i}"}, headers=admin)).json()["id"]
          for i in range(stylists)]
    r = await http.post(f"/v1/salons/{salon}:setBookingSettings",
                        json={"minNoticeMinutes": 0, "bookingHorizonDays": 30, "timeStepMinutes": 30}, headers=admin)
    assert r.status_code == 200, r.text
    for rid in rs:
        r = await http.post(f"/v1/salons/{salon}/resources/{rid}:setWorkingHours", headers=admin, json={
            "intervals": [{"weekday": d, "opens": "09:00", "closes": "18:00"} for d in range(1, 8)]})
        assert r.status_code == 200, r.text
    r = await http.post(f"/v1/salons/{salon}/services", headers=admin, json={
        "name": "Cut", "durationMinutes": 60, "bufferAfterMinutes": 15, "resourceIds": rs,
        "price": {"currencyCode": "EUR", "amountMinor": "4500"}})
    assert r.status_code == 200, r.text
    return salon, rs, r.json()


async def test_availability_then_any_stylist_checkout_and_the_loser_is_kept(http, auth, fresh_key):
    salon, (stylist,), service = await _service_salon(http, auth)
    day = (datetime.now(timezone.utc) + timedelta(days=2)).date().isoformat()
    me, rival = auth("customer"), auth("customer")
    r = await http.get(f"/v1/salons/{salon}/services/{service['id']}/availability", headers=me,
                       params={"startDay": day})
    assert r.status_code == 200, r.text
    times = r.json()["times"]
    assert times[0]["localStartTime"] == f"{day}T09:00:00+01:00" and times[0]["resourceIds"] == [stylist]
    ten = next(t for t in times if t["localStartTime"][11:16] == "10:00")

    r = await http.post("/v1/checkouts", json={"serviceId": service["id"], "startTime": ten["startTime"]},
                        headers={**me, **fresh_key()})
    assert r.status_code == 200, r.text
    assert state_of(r.json()) == "HELD" and r.json()["amount"] == {"currencyCode": "EUR", "amountMinor": "4500"}

    lost = await http.post("/v1/checkouts", json={"serviceId": service["id"], "startTime": ten["startTime"]},
                           headers={**rival, **fresh_key()})
    assert lost.status_code == 409, lost.text
    p = lost.json()
    assert p["type"] == "slot-unavailable" and p["alternatives"]
    offer = p["heldAlternative"]
    assert offer["offered"] and offer["slotId"] == p["alternatives"][0]["id"] and offer["resourceId"] == stylist
    # nobody else gets it meanwhile ...
    third = await http.post("/v1/checkouts", json={"slotId": offer["slotId"]}, headers={**auth("customer"), **fresh_key()})
    assert third.status_code == 409
    # ... and the loser takes it with one call
    taken = await http.post("/v1/checkouts", json={"slotId": offer["slotId"]}, headers={**rival, **fresh_key()})
    assert taken.status_code == 200, taken.text
    assert state_of(taken.json()) == "HELD" and taken.json()["holdId"] == offer["id"]


async def test_bad_service_times_are_named(http, auth, fresh_key):
    salon, _, service = await _service_salon(http, auth)
    me = auth("customer")
    start = (datetime.now(timezone.utc) + timedelta(days=2)).replace(hour=9, minute=7, second=0, microsecond=0)
    r = await http.post("/v1/checkouts", json={"serviceId": service["id"], "startTime": start.isoformat()},
                        headers={**me, **fresh_key()})
    assert (r.status_code, r.json().get("field")) == (400, "startTime"), r.text
    r = await http.get(f"/v1/salons/{salon}/services/{service['id']}/availability", headers=me,
                       params={"startDay": "2027-01-01", "endDay": "2027-03-01"})
    assert (r.status_code, r.json().get("field")) == (400, "endDay"), r.text
    r = await http.post(f"/v1/salons/{salon}/services", headers=auth("staff"), json={"name": "x"})
    assert r.status_code == 403
