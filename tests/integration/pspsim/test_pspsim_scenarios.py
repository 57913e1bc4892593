"""Every test payment method against the real simulator process, webhooks to a real receiver."""

import asyncio
import time

import httpx

from pspsim_harness import SYNC_TIMEOUT_DELAY, wait_for


async def test_card_ok(sim, receiver, new_key):
    key = new_key()
    r = await sim.create(key, "pm_card_ok", metadata={"payment_id": "pay_1"})
    assert r.status_code == 200
    intent = r.json()
    assert intent["status"] == "succeeded" and intent["next_action"] is None
    assert intent["metadata"] == {"payment_id": "pay_1"}
    [d] = await wait_for(lambda: receiver.for_intent(intent["id"]), what="succeeded webhook")
    assert d.event["type"] == "payment_intent.succeeded"
    assert d.event["id"].startswith("evt_")
    assert d.event["request"]["idempotency_key"] == key
    assert d.object["status"] == "succeeded" and d.object["metadata"] == {"payment_id": "pay_1"}
    assert d.signature_ok
    assert await sim.charges_for(key) == 1
    assert await sim.get(intent["id"]) == intent


async def test_card_declined(sim, receiver, new_key):
    key = new_key()
    intent = (await sim.create(key, "pm_card_declined")).json()
    assert intent["status"] == "failed"
    assert intent["last_payment_error"]["code"] == "card_declined"
    await wait_for(lambda: receiver.for_intent(intent["id"]))
    assert receiver.types(intent["id"]) == ["payment_intent.payment_failed"]
    assert await sim.charges_for(key) == 0


async def test_card_3ds_redirect_completes(sim, receiver, new_key, http):
    key = new_key()
    intent = (await sim.create(key, "pm_card_3ds")).json()
    assert intent["status"] == "requires_action" and intent["client_secret"]
    url = intent["next_action"]["redirect_url"]
    assert url == f"{sim.url}/3ds/{intent['id']}/complete"
    await wait_for(lambda: receiver.for_intent(intent["id"]))
    assert receiver.types(intent["id"]) == ["payment_intent.requires_action"]
    assert await sim.charges_for(key) == 0

    visited = await http.get(url)  # the customer's browser
    assert visited.status_code == 200 and visited.json()["status"] == "succeeded"
    await wait_for(lambda: len(receiver.for_intent(intent["id"])) == 2)
    assert receiver.types(intent["id"])[-1] == "payment_intent.succeeded"
    assert (await http.post(url)).json()["status"] == "succeeded"  # revisiting changes nothing
    assert (await sim.get(intent["id"]))["next_action"] is None
    assert await sim.charges_for(key) == 1


async def test_card_webhook_first(sim, receiver, new_key):
    key = new_key()
    intent = (await sim.create(key, "pm_card_webhook_first")).json()
    answered = time.monotonic()
    assert intent["status"] == "succeeded"
    # No waiting: the webhook was delivered and acknowledged before the answer came back.
    [d] = receiver.for_intent(intent["id"])
    assert d.event["type"] == "payment_intent.succeeded" and d.at < answered
    assert await sim.charges_for(key) == 1


async def test_card_duplicate_webhooks(sim, receiver, new_key):
    key = new_key()
    intent = (await sim.create(key, "pm_card_duplicate_webhooks")).json()
    assert intent["status"] == "succeeded"
    deliveries = await wait_for(lambda: (lambda ds: ds if len(ds) == 6 else None)(receiver.for_intent(intent["id"])),
                                what="6 deliveries")
    ids: dict[str, set] = {}
    for d in deliveries:
        ids.setdefault(d.event["type"], set()).add(d.event["id"])
    assert {t: len(s) for t, s in ids.items()} == {"payment_intent.succeeded": 1, "payment_intent.processing": 1}
    types = [d.event["type"] for d in deliveries]
    assert types.count("payment_intent.succeeded") == 3 and types.count("payment_intent.processing") == 3
    # Out of order: a stale "processing" arrives after "succeeded".
    assert types.index("payment_intent.succeeded") < len(types) - 1 - types[::-1].index("payment_intent.processing")
    assert all(d.signature_ok for d in deliveries)
    assert await sim.charges_for(key) == 1


async def test_card_no_webhook_only_reconciliation_learns(sim, receiver, new_key):
    key = new_key()
    intent = (await sim.create(key, "pm_card_no_webhook")).json()
    assert intent["status"] == "processing"
    await wait_for(lambda: _status_is(sim, intent["id"], "succeeded"), what="intent settles")
    assert await sim.charges_for(key) == 1
    # The simulator never created (so never sends) an event for this intent.
    assert [e for e in await sim.events() if e["object_id"] == intent["id"]] == []
    assert receiver.for_intent(intent["id"], acked_only=False) == []


async def _status_is(sim, intent_id, status):
    return (await sim.get(intent_id))["status"] == status


async def test_card_sync_timeout_then_retry_charges_once(sim, receiver, new_key):
    key = new_key()
    started = time.monotonic()
    try:
        await sim.create(key, "pm_card_sync_timeout", timeout=0.25)
        raise AssertionError("expected a client timeout")
    except httpx.TimeoutException:
        pass
    assert time.monotonic() - started < SYNC_TIMEOUT_DELAY
    # The money moved even though the caller saw a timeout.
    assert await sim.charges_for(key) == 1
    retry = await sim.create(key, "pm_card_sync_timeout")
    assert retry.status_code == 200 and retry.json()["status"] == "succeeded"
    await wait_for(lambda: receiver.for_intent(retry.json()["id"]))
    assert receiver.types(retry.json()["id"]) == ["payment_intent.succeeded"]
    assert await sim.charges_for(key) == 1


async def test_card_sync_timeout_patient_client_gets_504(sim, new_key):
    key = new_key()
    started = time.monotonic()
    r = await sim.create(key, "pm_card_sync_timeout", timeout=SYNC_TIMEOUT_DELAY + 5)
    assert r.status_code == 504 and r.json()["error"]["type"] == "api_error"
    assert time.monotonic() - started >= SYNC_TIMEOUT_DELAY
    assert await sim.charges_for(key) == 1


async def test_unknown_payment_method_and_missing_key(sim, new_key):
    r = await sim.create(new_key(), "pm_card_visa")
    assert r.status_code == 400 and r.json()["error"]["param"] == "payment_method"
    r = await sim.create(None)
    assert r.status_code == 400 and r.json()["error"]["code"] == "idempotency_key_missing"
    r = await sim.http.get(f"{sim.url}/v1/payment_intents/pi_nope")
    assert r.status_code == 404


async def test_idempotent_create(sim, receiver, new_key):
    key = new_key()
    first = (await sim.create(key)).json()
    second = await sim.create(key)
    assert second.status_code == 200 and second.json()["id"] == first["id"]
    mismatch = await sim.create(key, amount=2000)
    assert mismatch.status_code == 422 and mismatch.json()["error"]["type"] == "idempotency_error"
    assert await sim.charges_for(key) == 1
    await wait_for(lambda: receiver.for_intent(first["id"]))
    assert len([e for e in await sim.events() if e["object_id"] == first["id"]]) == 1


async def test_concurrent_creates_with_one_key_charge_once(sim, new_key):
    key = new_key()
    answers = await asyncio.gather(*(sim.create(key) for _ in range(20)))
    assert {a.status_code for a in answers} == {200}
    assert len({a.json()["id"] for a in answers}) == 1
    assert await sim.charges_for(key) == 1


async def test_injected_503_then_retry(sim, new_key):
    key = new_key()
    assert (await sim.post("/v1/_faults", {"fail_next_creates": 2})).status_code == 200
    statuses = [(await sim.create(key)).status_code for _ in range(3)]
    assert statuses == [503, 503, 200]
    assert await sim.charges_for(key) == 1


async def test_cancel(sim, receiver, new_key, http):
    action = (await sim.create(new_key(), "pm_card_3ds")).json()
    r = await sim.post(f"/v1/payment_intents/{action['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "canceled" and r.json()["next_action"] is None
    assert (await sim.post(f"/v1/payment_intents/{action['id']}/cancel")).json()["status"] == "canceled"
    late = await http.get(action["next_action"]["redirect_url"])
    assert late.status_code == 409 and late.json()["error"]["payment_intent"]["status"] == "canceled"
    await wait_for(lambda: len(receiver.for_intent(action["id"])) == 2)
    assert receiver.types(action["id"]) == ["payment_intent.requires_action", "payment_intent.canceled"]

    paid = (await sim.create(new_key(), "pm_card_ok")).json()
    r = await sim.post(f"/v1/payment_intents/{paid['id']}/cancel")
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "payment_intent_unexpected_state"
    assert r.json()["error"]["payment_intent"]["status"] == "succeeded"


async def test_refunds(sim, receiver, new_key):
    key = new_key()
    intent = (await sim.create(key, amount=1000)).json()
    rkey = new_key()
    r1 = await sim.post("/v1/refunds", {"payment_intent": intent["id"], "amount": 300}, key=rkey)
    assert r1.status_code == 200
    refund = r1.json()
    assert refund["id"].startswith("re_")
    assert (refund["payment_intent"], refund["amount"], refund["status"]) == (intent["id"], 300, "succeeded")
    replay = await sim.post("/v1/refunds", {"payment_intent": intent["id"], "amount": 300}, key=rkey)
    assert replay.status_code == 200 and replay.json()["id"] == refund["id"]
    reused = await sim.post("/v1/refunds", {"payment_intent": intent["id"], "amount": 200}, key=rkey)
    assert reused.status_code == 422
    over = await sim.post("/v1/refunds", {"payment_intent": intent["id"], "amount": 701}, key=new_key())
    assert over.status_code == 400 and over.json()["error"]["code"] == "amount_too_large"
    rest = await sim.post("/v1/refunds", {"payment_intent": intent["id"]}, key=new_key())
    assert rest.status_code == 200 and rest.json()["amount"] == 700
    assert (await sim.get(intent["id"]))["amount_refunded"] == 1000

    declined = (await sim.create(new_key(), "pm_card_declined")).json()
    r = await sim.post("/v1/refunds", {"payment_intent": declined["id"]}, key=new_key())
    assert r.status_code == 400

    ledger = await sim.ledger()
    mine = [x for x in ledger["refunds"] if x["intent_id"] == intent["id"]]
    assert sorted(x["amount"] for x in mine) == [300, 700]
    assert {x["idempotency_key"] for x in mine} >= {rkey}
    await wait_for(lambda: receiver.types(intent["id"]).count("charge.refunded") == 2, what="2 refund webhooks")
    refunded = [d for d in receiver.for_intent(intent["id"]) if d.event["type"] == "charge.refunded"]
    assert {d.object["id"] for d in refunded} == {refund["id"], rest.json()["id"]}
    stats = [e for e in await sim.events() if e["intent_id"] == intent["id"] and e["type"] == "charge.refunded"]
    assert {e["object_id"] for e in stats} == {refund["id"], rest.json()["id"]}
    assert await sim.charges_for(key) == 1
