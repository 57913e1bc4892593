"""GET /v1/salons/{id}/slots pages with pageSize / pageToken query parameters; a
bad token is a 400 problem naming the field."""
import datetime as dt
import uuid
from urllib.parse import quote


async def test_slots_are_paged_through_the_gateway(http, auth):
    admin, customer = auth("admin"), auth("customer", f"c-{uuid.uuid4().hex[:8]}")
    salon = (await http.post("/v1/salons", json={"name": "Paged", "timeZone": "Europe/Istanbul"}, headers=admin)).json()
    chair = (await http.post(f"/v1/salons/{salon['id']}/resources", json={"name": "chair"}, headers=admin)).json()
    day = dt.datetime.now(dt.timezone.utc).replace(hour=6, minute=0, second=0, microsecond=0) + dt.timedelta(days=2)
    slots = [{"resourceId": chair["id"], "startTime": (day + dt.timedelta(hours=i)).isoformat(),
              "endTime": (day + dt.timedelta(hours=i + 1)).isoformat(),
              "price": {"currencyCode": "TRY", "amountMinor": "100"}} for i in range(3)]
    r = await http.post(f"/v1/salons/{salon['id']}/slots:batchCreate", json={"slots": slots}, headers=admin)
    assert r.status_code == 200, r.text
    window = f"startTime={quote(day.isoformat())}&endTime={quote((day + dt.timedelta(days=1)).isoformat())}"
    base = f"/v1/salons/{salon['id']}/slots?{window}"

    first = await http.get(f"{base}&pageSize=2", headers=customer)
    assert first.status_code == 200, first.text
    assert len(first.json()["slots"]) == 2 and first.json()["nextPageToken"]
    second = await http.get(f"{base}&pageSize=2&pageToken={quote(first.json()['nextPageToken'])}", headers=customer)
    assert second.status_code == 200, second.text
    assert len(second.json()["slots"]) == 1 and not second.json().get("nextPageToken")
    seen = [s["id"] for s in first.json()["slots"] + second.json()["slots"]]
    assert sorted(seen) == sorted(s["id"] for s in r.json()["slots"]) and len(set(seen)) == 3

    bad = await http.get(f"{base}&pageToken=forged", headers=customer)
    assert bad.status_code == 400 and bad.json()["field"] == "pageToken", bad.text
    negative = await http.get(f"{base}&pageSize=-5", headers=customer)
    assert negative.status_code == 400 and negative.json()["field"] == "pageSize", negative.text
