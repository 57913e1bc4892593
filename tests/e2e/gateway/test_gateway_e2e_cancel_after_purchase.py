"""Over HTTP through the gateway (real processes: booking, payments, the PSP
simulator): a salon's cancellation policy, a customer cancelling a completed booking past its free
cancellation (the fee kept, the rest refunded) and seeing CANCELLED_AFTER_PURCHASE with the refund
amount, a repeat answering the same, the slot bookable again; the merchant's staff cancelling with a
full refund and a reason, another merchant's staff 404."""
import datetime as dt
import uuid
from zoneinfo import ZoneInfo

from tests.e2e.gateway.conftest import buy_booking, make_token, state_of


async def _salon_with_policy(http, auth, **policy) -> tuple[str, str]:
    admin = auth("admin")
    s = await http.post("/v1/salons", json={"name": "Policy salon", "timeZone": "Europe/Berlin", **policy},
                        headers=admin)
    assert s.status_code == 200, s.text
    r = await http.post(f"/v1/salons/{s.json()['id']}/resources", json={"name": "chair"}, headers=admin)
    assert r.status_code == 200, r.text
    return s.json()["id"], r.json()["id"]


async def _slot(http, auth, salon: str, resource: str, days: int, hour: int) -> str:
    zone = ZoneInfo("Europe/Berlin")
    day = dt.datetime.now(zone).date() + dt.timedelta(days=days)
    start = dt.datetime(day.year, day.month, day.day, hour, tzinfo=zone)
    r = await http.post(f"/v1/salons/{salon}/slots:batchCreate", headers=auth("admin"), json={"slots": [
        {"resourceId": resource, "startTime": start.isoformat(), "endTime": (start + dt.timedelta(hours=1)).isoformat(),
         "price": {"currencyCode": "EUR", "amountMinor": "7999"}}]})
    assert r.status_code == 200, r.text
    return r.json()["slots"][0]["id"]


async def test_a_bad_policy_is_400_naming_the_field(http, auth):
    r = await http.post("/v1/salons", json={"name": "x", "timeZone": "Europe/Berlin", "cancellationFeePercent": 101},
                        headers=auth("admin"))
    assert r.status_code == 400 and r.json()["field"] == "cancellationFeePercent", r.text


async def test_a_customer_cancels_a_completed_booking_per_its_policy(http, auth, fresh_key, until_state):
    salon, chair = await _salon_with_policy(http, auth, freeCancellationHours=96, cancellationFeePercent=25)
    slot = await _slot(http, auth, salon, chair, days=2, hour=10)  # within 96 h: the fee applies
    me = auth("customer")
    done = await buy_booking(http, me, fresh_key, until_state, slot)
    assert (done["freeCancellationHours"], done["cancellationFeePercent"]) == (96, 25)
    assert done["freeCancellationDeadline"] and done["startTime"]

    r = await http.post(f"/v1/checkouts/{done['id']}:cancel", json={}, headers=me)
    assert r.status_code == 200, r.text
    out = r.json()
    assert state_of(out) == "CANCELLED_AFTER_PURCHASE", out
    # 7999 * 75 % = 5999.25: rounded down
    assert out["refundAmount"] == {"currencyCode": "EUR", "amountMinor": "5999"}
    assert out["payment"]["status"] == "PAYMENT_STATUS_PARTIALLY_REFUNDED"
    again = await http.post(f"/v1/checkouts/{done['id']}:cancel", json={}, headers=me)
    assert again.status_code == 200 and again.json()["refundAmount"] == out["refundAmount"]
    seen = await http.get(f"/v1/checkouts/{done['id']}", headers=me)
    assert state_of(seen.json()) == "CANCELLED_AFTER_PURCHASE"
    # The time is bookable again.
    other = await http.post("/v1/checkouts", json={"slotId": slot}, headers={**auth("customer"), **fresh_key()})
    assert other.status_code == 200 and state_of(other.json()) == "HELD", other.text


async def test_staff_cancel_with_a_full_refund_and_a_reason(http, auth, fresh_key, until_state):
    salon, chair = await _salon_with_policy(http, auth, freeCancellationHours=96, cancellationFeePercent=100)
    slot = await _slot(http, auth, salon, chair, days=2, hour=12)
    me = auth("customer")
    done = await buy_booking(http, me, fresh_key, until_state, slot)
    path = f"/v1/checkouts/{done['id']}:cancel"
    staff = auth("staff")
    no_reason = await http.post(path, json={}, headers=staff)
    assert no_reason.status_code == 400 and no_reason.json()["field"] == "reason", no_reason.text
    other = {"Authorization": f"Bearer {make_token('staff', org='merchant-other-' + uuid.uuid4().hex[:6])}"}
    assert (await http.post(path, json={"reason": "mine"}, headers=other)).status_code == 404
    assert (await http.post(path, json={"reason": "x"}, headers=auth("operator"))).status_code == 403
    r = await http.post(path, json={"reason": "the salon is closed for a burst pipe"}, headers=staff)
    assert r.status_code == 200, r.text
    out = r.json()
    assert state_of(out) == "CANCELLED_AFTER_PURCHASE"
    assert out["refundAmount"]["amountMinor"] == "7999" and out["cancelReason"] == "the salon is closed for a burst pipe"
    assert out["cancelledBy"].startswith("staff:")
    mine = (await http.get(f"/v1/checkouts/{done['id']}", headers=me)).json()
    assert state_of(mine) == "CANCELLED_AFTER_PURCHASE" and mine["payment"]["status"] == "PAYMENT_STATUS_REFUNDED"


async def test_a_policy_change_applies_to_new_bookings_not_to_ones_alreadybuy_booking(http, auth, fresh_key, until_state):
    salon, chair = await _salon_with_policy(http, auth, freeCancellationHours=96, cancellationFeePercent=25)
    bought_slot = await _slot(http, auth, salon, chair, days=2, hour=14)
    held_slot = await _slot(http, auth, salon, chair, days=2, hour=15)
    later_slot = await _slot(http, auth, salon, chair, days=2, hour=16)
    me = auth("customer")
    bought = await buy_booking(http, me, fresh_key, until_state, bought_slot)
    held = await http.post("/v1/checkouts", json={"slotId": held_slot}, headers={**me, **fresh_key()})
    assert held.status_code == 200 and state_of(held.json()) == "HELD", held.text

    path = f"/v1/salons/{salon}:setCancellationPolicy"
    bad = await http.post(path, json={"cancellationFeePercent": 150}, headers=auth("admin"))
    assert bad.status_code == 400 and bad.json()["field"] == "cancellationFeePercent", bad.text
    other = {"Authorization": f"Bearer {make_token('admin', org='merchant-other-' + uuid.uuid4().hex[:6])}"}
    assert (await http.post(path, json={"cancellationFeePercent": 100}, headers=other)).status_code == 404
    assert (await http.post(path, json={"cancellationFeePercent": 100}, headers=auth("staff"))).status_code == 403
    r = await http.post(path, json={"freeCancellationHours": 0, "cancellationFeePercent": 0}, headers=auth("admin"))
    assert r.status_code == 200, r.text
    assert (r.json()["id"], r.json()["freeCancellationHours"], r.json()["cancellationFeePercent"]) == (salon, 0, 0)

    # the held checkout still shows the policy it was held under
    seen = (await http.get(f"/v1/checkouts/{held.json()['id']}", headers=me)).json()
    assert (seen["freeCancellationHours"], seen["cancellationFeePercent"]) == (96, 25)
    # the booking bought before the change is cancelled under its own policy: the 25 % fee is kept
    out = await http.post(f"/v1/checkouts/{bought['id']}:cancel", json={}, headers=me)
    assert out.status_code == 200 and state_of(out.json()) == "CANCELLED_AFTER_PURCHASE", out.text
    assert out.json()["refundAmount"] == {"currencyCode": "EUR", "amountMinor": "5999"}
    # one bought after the change gets the new policy: free until the start, a full refund
    after = await buy_booking(http, auth("customer"), fresh_key, until_state, later_slot)
    assert (after["freeCancellationHours"], after["cancellationFeePercent"]) == (0, 0)
