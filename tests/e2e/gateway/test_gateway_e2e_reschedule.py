"""Over HTTP through the gateway (real processes): a customer reschedules their
completed booking to a dearer slot of the salon (the difference charged with the purchase's card)
and sees the new slot in the answer; the merchant's endpoint receives a verified
`booking.rescheduled`; bad input is a 400 problem naming `slotId` and changes nothing; another
customer's booking is 404, another merchant's staff 404, the operator 403; a slot taken by another
buyer is a 409 `slot-unavailable` with alternatives; past the free-cancellation deadline the
customer is refused and the salon's staff may still reschedule."""
import datetime as dt
import uuid

from payments import signature
from tests.e2e.gateway.conftest import buy_booking, make_token, state_of
from webhook_receiver import Receiver


async def _salon(http, auth, **policy) -> tuple[str, str]:
    admin = auth("admin")
    s = await http.post("/v1/salons", json={"name": "Reschedule salon", "timeZone": "Europe/Istanbul", **policy},
                        headers=admin)
    assert s.status_code == 200, s.text
    r = await http.post(f"/v1/salons/{s.json()['id']}/resources", json={"name": "chair"}, headers=admin)
    assert r.status_code == 200, r.text
    return s.json()["id"], r.json()["id"]


async def _slots(http, auth, salon: str, resource: str, *prices: int, days: int = 3) -> list[str]:
    base = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=days)).replace(minute=0, second=0, microsecond=0)
    slots = [{"resourceId": resource, "startTime": (base + dt.timedelta(hours=i)).isoformat(),
              "endTime": (base + dt.timedelta(hours=i + 1)).isoformat(),
              "price": {"currencyCode": "TRY", "amountMinor": str(p)}} for i, p in enumerate(prices)]
    r = await http.post(f"/v1/salons/{salon}/slots:batchCreate", json={"slots": slots}, headers=auth("admin"))
    assert r.status_code == 200, r.text
    return [s["id"] for s in r.json()["slots"]]


async def test_a_customer_reschedules_to_a_dearer_slot_and_the_merchant_hears_of_it(http, auth, fresh_key,
                                                                                    until_state):
    salon, chair = await _salon(http, auth)
    a, b = await _slots(http, auth, salon, chair, 7999, 9999)
    admin = auth("admin")
    async with Receiver() as rx:
        ep = await http.post("/v1/webhookEndpoints", json={"url": rx.url, "events": ["booking.rescheduled"]},
                             headers=admin)
        assert ep.status_code == 200, ep.text
        endpoint = ep.json()
        rx.secrets.append(endpoint["secret"])
        try:
            me = auth("customer")
            done = await buy_booking(http, me, fresh_key, until_state, a)
            path = f"/v1/checkouts/{done['id']}:reschedule"
            r = await http.post(path, json={"slotId": b}, headers={**me, **fresh_key()})
            assert r.status_code == 200, r.text
            out = r.json()
            assert state_of(out) == "COMPLETED" and out["slotId"] == b and out["amount"]["amountMinor"] == "9999"
            assert out["reschedule"]["status"] == "rescheduled" and out["reschedule"]["previousSlotId"] == a
            assert out["reschedule"]["difference"] == {"currencyCode": "TRY", "amountMinor": "2000"}
            seen = (await http.get(f"/v1/checkouts/{done['id']}", headers=me)).json()
            assert seen["slotId"] == b and seen["holdId"] == out["holdId"]

            def ours(evs):
                return [e for e in evs.values() if e["data"]["checkout"]["id"] == done["id"]]
            await rx.until(lambda evs: len(ours(evs)) == 1, timeout=30)
            (event,) = ours(rx.events)
            assert event["type"] == "booking.rescheduled"
            assert (event["data"]["checkout"]["slot_id"], event["data"]["checkout"]["previous_slot_id"]) == (b, a)
            req = next(q for q in rx.requests if q["headers"]["cuty-event-id"] == event["id"])
            signature.verify(req["headers"]["cuty-signature"], req["body"], [endpoint["secret"]])
        finally:
            await http.delete(f"/v1/webhookEndpoints/{endpoint['id']}", headers=admin)


async def test_bad_input_and_strangers_change_nothing(http, auth, fresh_key, until_state):
    salon, chair = await _salon(http, auth)
    a, b = await _slots(http, auth, salon, chair, 7999, 7999)
    me = auth("customer")
    done = await buy_booking(http, me, fresh_key, until_state, a)
    path = f"/v1/checkouts/{done['id']}:reschedule"
    for body in ({}, {"slotId": "tomorrow"}, {"slotId": a}):
        r = await http.post(path, json=body, headers={**me, **fresh_key()})
        assert r.status_code == 400, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json") and r.json()["field"] == "slotId"
    assert (await http.post(path, json={"slotId": b}, headers={**auth("customer"), **fresh_key()})).status_code == 404
    other_staff = {"Authorization": f"Bearer {make_token('staff', org='merchant-other-' + uuid.uuid4().hex[:6])}"}
    assert (await http.post(path, json={"slotId": b}, headers={**other_staff, **fresh_key()})).status_code == 404
    assert (await http.post(path, json={"slotId": b}, headers={**auth("operator"), **fresh_key()})).status_code == 403
    seen = (await http.get(f"/v1/checkouts/{done['id']}", headers=me)).json()
    assert seen["slotId"] == a and "reschedule" not in seen


async def test_a_taken_slot_is_409_with_alternatives_and_the_booking_stays(http, auth, fresh_key, until_state):
    salon, chair = await _salon(http, auth)
    a, b, c = await _slots(http, auth, salon, chair, 7999, 7999, 7999)
    me = auth("customer")
    done = await buy_booking(http, me, fresh_key, until_state, a)
    rival = await http.post("/v1/checkouts", json={"slotId": b}, headers={**auth("customer"), **fresh_key()})
    assert rival.status_code == 200, rival.text
    r = await http.post(f"/v1/checkouts/{done['id']}:reschedule", json={"slotId": b}, headers={**me, **fresh_key()})
    assert r.status_code == 409 and r.json()["type"].endswith("slot-unavailable"), r.text
    assert c in [s["id"] for s in r.json()["alternatives"]]
    seen = (await http.get(f"/v1/checkouts/{done['id']}", headers=me)).json()
    assert state_of(seen) == "COMPLETED" and seen["slotId"] == a and seen["reschedule"]["status"] == "reverted"


async def test_past_the_deadline_only_staff_reschedule(http, auth, fresh_key, until_state):
    salon, chair = await _salon(http, auth, freeCancellationHours=96)
    a, b, c = await _slots(http, auth, salon, chair, 7999, 5999, 5999, days=2)  # within 96 h of the start
    me = auth("customer")
    done = await buy_booking(http, me, fresh_key, until_state, a)
    path = f"/v1/checkouts/{done['id']}:reschedule"
    late = await http.post(path, json={"slotId": b}, headers={**me, **fresh_key()})
    assert late.status_code == 409 and late.json()["type"].endswith("reschedule-deadline-passed"), late.text
    staff = await http.post(path, json={"slotId": b}, headers={**auth("staff"), **fresh_key()})
    assert staff.status_code == 200, staff.text
    out = staff.json()
    assert out["slotId"] == b and out["reschedule"]["rescheduledBy"].startswith("staff:")
    assert out["reschedule"]["difference"]["amountMinor"] == "-2000"
    assert out["payment"]["status"] == "PAYMENT_STATUS_PARTIALLY_REFUNDED"
    # Moved by the salon, the customer still may not move it again (and is told why).
    again = await http.post(path, json={"slotId": c}, headers={**me, **fresh_key()})
    assert again.status_code == 409 and again.json()["type"].endswith("reschedule-deadline-passed"), again.text
