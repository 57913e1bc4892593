"""The gateway's memo tables (memo.py) never change an answer: a GET whose answer changed gets the
new JSON, the same body posted twice reaches the service twice with each request's own path and
headers, and a refused request stays refused."""
import json

from cuty.payments.v1 import checkout_pb2

from gateway.memo import Memo


async def test_a_repeated_read_follows_its_answer(client, fake, bearer):
    ids = iter(["first", "first", "second", "first"])
    fake.scripts["GetCheckout"] = lambda req, md: checkout_pb2.Checkout(id=next(ids))
    try:
        h = bearer("customer")
        got = [(await client.get("/v1/checkouts/00000000-0000-4000-8000-000000000010", headers=h)).json()["id"] for _ in range(4)]
        assert got == ["first", "first", "second", "first"]
    finally:
        fake.scripts.pop("GetCheckout", None)


async def test_a_repeated_query_reaches_the_service_each_time(client, fake, bearer):
    h = bearer("customer")
    path = "/v1/salons/00000000-0000-4000-8000-000000000009/slots?startTime=2026-03-08T00:00:00Z&endTime=2026-03-09T00:00:00Z&availableOnly=true"
    before = len([c for c in fake.calls if c.rpc == "ListSlots"])
    for _ in range(3):
        assert (await client.get(path, headers=h)).status_code == 200
    calls = [c for c in fake.calls if c.rpc == "ListSlots"][before:]
    assert len(calls) == 3
    assert all(c.request.salon_id == "00000000-0000-4000-8000-000000000009" and c.request.available_only for c in calls)
    assert all(c.request.start_time.ToJsonString() == "2026-03-08T00:00:00Z" for c in calls)


async def test_the_same_body_twice_reaches_the_service_each_time_with_its_own_key(client, fake, bearer):
    def created(req, md):
        return checkout_pb2.Checkout(id=f"ck-{md['idempotency-key']}")
    fake.scripts["CreateCheckout"] = created
    try:
        body = json.dumps({"slotId": "00000000-0000-4000-8000-000000000011"})
        for key in ("memo-k1", "memo-k2"):
            r = await client.post("/v1/checkouts", content=body,
                                  headers={**bearer("customer", sub=f"sub-{key}"), "Idempotency-Key": key})
            assert r.status_code == 200, r.text
            assert r.json()["id"] == f"ck-{key}"
            call = fake.last("CreateCheckout")
            assert call.request.slot_id == "00000000-0000-4000-8000-000000000011"
            assert call.metadata["idempotency-key"] == key
            assert call.who.subject == f"sub-{key}"
    finally:
        fake.scripts.pop("CreateCheckout", None)


async def test_path_variables_are_part_of_the_memoised_request(client, fake, bearer):
    h = {**bearer("customer"), "Idempotency-Key": "memo-pay"}
    for checkout in ("00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000a2"):
        r = await client.post(f"/v1/checkouts/{checkout}:pay", content=json.dumps({"paymentMethod": "pm_card_ok"}),
                              headers=h)
        assert r.status_code == 200, r.text
        assert fake.last("PayCheckout").request.checkout_id == checkout


async def test_a_refused_request_stays_refused(client, bearer):
    h = {**bearer("customer"), "Idempotency-Key": "memo-bad"}
    for _ in range(2):
        r = await client.post("/v1/checkouts", content=json.dumps({"slotId": "00000000-0000-4000-8000-000000000013", "nope": 1}), headers=h)
        assert r.status_code == 400
        assert r.json()["field"] == "nope"


def test_memo_is_bounded_by_entries_and_bytes():
    m = Memo(max_entries=2, max_bytes=100)
    m.put("a", b"1", 10)
    m.put("b", b"2", 10)
    assert m.get("a") == b"1" and len(m) == 2
    m.put("c", b"3", 10)  # full by entries: cleared, then kept
    assert m.get("a") is None and m.get("c") == b"3" and len(m) == 1
    m.put("d", b"4", 95)  # would pass the byte bound: cleared first
    assert m.get("c") is None and m.get("d") == b"4"
    m.put("e", b"5", 101)  # larger than the whole bound: never kept
    assert m.get("e") is None
