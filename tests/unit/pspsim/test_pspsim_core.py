"""The PSP's operations, without its HTTP API: webhooks go to a local receiver (conftest.Hook)."""

import asyncio
import random

import pytest

from pspsim import signing
from pspsim.validation import ApiError
from pspsim.settings import Settings
from pspsim.webhooks import WebhookDispatcher


def body(pm="pm_card_ok", amount=1000, **extra):
    return {"amount": amount, "currency": "TRY", "payment_method": pm, "metadata": {"order": "o1"}, **extra}


async def test_ok_succeeds_and_sends_one_signed_webhook(make_psp, wait_for):
    psp, hook = await make_psp()
    intent = await psp.create_intent("k1", body())
    assert intent["status"] == "succeeded" and intent["next_action"] is None
    assert intent["id"].startswith("pi_") and intent["client_secret"].startswith(intent["id"] + "_secret_")
    await wait_for(lambda: hook.acked(intent["id"]), what="webhook")
    [d] = hook.deliveries
    assert d["event"]["type"] == "payment_intent.succeeded"
    assert d["event"]["request"]["idempotency_key"] == "k1"
    assert d["event"]["data"]["object"]["status"] == "succeeded"
    assert signing.verify(d["signature"], d["body"], psp.settings.webhook_secrets)
    assert psp.store.ledger()["charge_count_by_key"] == {"k1": 1}


async def test_idempotent_replay_and_mismatch(make_psp):
    psp, _ = await make_psp()
    a = await psp.create_intent("k", body())
    b = await psp.create_intent("k", body())
    assert a["id"] == b["id"]
    with pytest.raises(ApiError) as err:
        await psp.create_intent("k", body(amount=999))
    assert err.value.status == 422 and err.value.error["type"] == "idempotency_error"
    # Normalised parameters: "try" is the same currency as "TRY".
    c = await psp.create_intent("k", {**body(), "currency": "try"})
    assert c["id"] == a["id"]
    assert psp.store.ledger()["charge_count_by_key"] == {"k": 1}


@pytest.mark.parametrize(
    "bad, param, code",
    [
        ({"amount": 0}, "amount", "parameter_invalid_integer"),
        ({"amount": 10.5}, "amount", "parameter_invalid_integer"),
        ({"amount": True}, "amount", "parameter_invalid_integer"),
        ({"amount": "100"}, "amount", "parameter_invalid_integer"),
        ({"currency": "TL"}, "currency", "parameter_invalid"),
        ({"payment_method": "pm_card_visa"}, "payment_method", "payment_method_unknown"),
        ({"metadata": []}, "metadata", "parameter_invalid"),
        ({"customer": "c1"}, "customer", "parameter_invalid"),
        ({"setup_future_usage": "on_session"}, "setup_future_usage", "parameter_invalid"),
        ({"off_session": "yes"}, "off_session", "parameter_invalid"),
        ({"off_session": True, "payment_method": "pm_card_ok", "customer": "cus_1"}, "payment_method",
         "payment_method_unknown"),
        ({"off_session": True, "payment_method": "pm_saved_1"}, "customer", "parameter_missing"),
    ],
)
async def test_create_validation(make_psp, bad, param, code):
    psp, _ = await make_psp()
    with pytest.raises(ApiError) as err:
        await psp.create_intent("k", {**body(), **bad})
    assert (err.value.status, err.value.error["param"], err.value.error["code"]) == (400, param, code)
    assert psp.store.lookup_key("create", "k") is None  # a refused request does not burn the key


async def test_missing_field_and_key(make_psp):
    psp, _ = await make_psp()
    with pytest.raises(ApiError) as err:
        await psp.create_intent("k", {"amount": 1, "currency": "TRY"})
    assert err.value.error["param"] == "payment_method"
    for key in (None, "", "x" * 256):
        with pytest.raises(ApiError) as err:
            await psp.create_intent(key, body())
        assert err.value.status == 400 and err.value.error["code"].startswith("idempotency_key")


async def test_declined(make_psp, wait_for):
    psp, hook = await make_psp()
    intent = await psp.create_intent("k", body("pm_card_declined"))
    assert intent["status"] == "failed"
    assert intent["last_payment_error"]["code"] == "card_declined"
    await wait_for(lambda: hook.acked(intent["id"]))
    assert hook.acked()[0]["type"] == "payment_intent.payment_failed"
    assert psp.store.ledger()["charges"] == []


async def test_3ds_complete_and_fail(make_psp, wait_for):
    psp, hook = await make_psp(public_url="http://psp.test")
    a = await psp.create_intent("a", body("pm_card_3ds"))
    assert a["status"] == "requires_action"
    assert a["next_action"]["redirect_url"] == f"http://psp.test/3ds/{a['id']}/complete"
    assert psp.store.ledger()["charges"] == []
    done = psp.complete_action(a["id"], succeed=True)
    assert done["status"] == "succeeded" and done["next_action"] is None
    assert psp.complete_action(a["id"], succeed=True)["status"] == "succeeded"  # revisit: no-op
    with pytest.raises(ApiError) as err:
        psp.complete_action(a["id"], succeed=False)
    assert err.value.status == 409
    await wait_for(lambda: len(hook.acked(a["id"])) == 2)
    assert [e["type"] for e in hook.acked(a["id"])] == ["payment_intent.requires_action", "payment_intent.succeeded"]
    assert psp.store.ledger()["charge_count_by_key"] == {"a": 1}

    b = await psp.create_intent("b", body("pm_card_3ds"))
    failed = psp.complete_action(b["id"], succeed=False)
    assert failed["status"] == "failed" and failed["next_action"] is None
    assert failed["last_payment_error"]["code"] == "payment_intent_authentication_failure"
    await wait_for(lambda: len(hook.acked(b["id"])) == 2)
    assert hook.acked(b["id"])[1]["type"] == "payment_intent.payment_failed"


async def test_webhook_first_is_delivered_before_the_answer(make_psp):
    psp, hook = await make_psp(webhook_delay_ms=500)
    intent = await psp.create_intent("k", body("pm_card_webhook_first"))
    assert intent["status"] == "succeeded"
    assert [e["type"] for e in hook.acked(intent["id"])] == ["payment_intent.succeeded"]


async def test_webhook_first_keeps_retrying_when_receiver_fails(make_psp, wait_for):
    psp, hook = await make_psp()
    hook.status_for = lambda event, attempt: 200 if attempt >= 3 else 503
    intent = await psp.create_intent("k", body("pm_card_webhook_first"))
    assert intent["status"] == "succeeded" and len(hook.deliveries) == 1
    await wait_for(lambda: hook.acked(intent["id"]))
    assert len(hook.deliveries) == 3
    assert len({d["event"]["id"] for d in hook.deliveries}) == 1


async def test_duplicate_webhooks_scrambled(make_psp, wait_for):
    psp, hook = await make_psp()
    intent = await psp.create_intent("k", body("pm_card_duplicate_webhooks"))
    assert intent["status"] == "succeeded"
    await wait_for(lambda: len(hook.acked(intent["id"])) == 6)
    events = hook.acked(intent["id"])
    by_type = {}
    for e in events:
        by_type.setdefault(e["type"], set()).add(e["id"])
    assert set(by_type) == {"payment_intent.succeeded", "payment_intent.processing"}
    assert all(len(ids) == 1 for ids in by_type.values())
    assert [e["type"] for e in events].count("payment_intent.succeeded") == 3
    assert events[0]["type"] == "payment_intent.succeeded"
    assert events[-1]["type"] == "payment_intent.processing"
    assert events[-1]["data"]["object"]["status"] == "processing"


async def test_no_webhook_settles_silently(make_psp, wait_for):
    psp, hook = await make_psp()
    intent = await psp.create_intent("k", body("pm_card_no_webhook"))
    assert intent["status"] == "processing"
    await wait_for(lambda: psp.get_intent(intent["id"])["status"] == "succeeded")
    assert psp.store.ledger()["charge_count_by_key"] == {"k": 1}
    refund = psp.create_refund("r", {"payment_intent": intent["id"]})
    assert refund["amount"] == 1000
    assert hook.deliveries == [] and psp.webhooks.snapshot() == []


async def test_cancel_processing_before_it_settles(make_psp):
    psp, hook = await make_psp(settle_delay_ms=60_000)
    intent = await psp.create_intent("k", body("pm_card_no_webhook"))
    canceled = psp.cancel_intent(intent["id"], {"cancellation_reason": "abandoned"})
    assert canceled["status"] == "canceled" and canceled["cancellation_reason"] == "abandoned"
    psp.settle(psp.store.intents[intent["id"]])  # the timer firing late changes nothing
    assert psp.get_intent(intent["id"])["status"] == "canceled"
    assert psp.store.ledger()["charges"] == []


async def test_cancel_rules(make_psp, wait_for):
    psp, hook = await make_psp()
    action = await psp.create_intent("a", body("pm_card_3ds"))
    assert psp.cancel_intent(action["id"], {})["status"] == "canceled"
    assert psp.cancel_intent(action["id"], {})["status"] == "canceled"  # idempotent, one webhook
    with pytest.raises(ApiError) as err:
        psp.complete_action(action["id"], succeed=True)
    assert err.value.status == 409
    ok = await psp.create_intent("b", body())
    with pytest.raises(ApiError) as err:
        psp.cancel_intent(ok["id"], {})
    assert err.value.status == 409
    assert err.value.error["code"] == "payment_intent_unexpected_state"
    assert err.value.error["payment_intent"]["status"] == "succeeded"
    with pytest.raises(ApiError) as err:
        psp.cancel_intent("pi_missing", {})
    assert err.value.status == 404
    await wait_for(lambda: len(hook.acked(action["id"])) == 2)
    assert [e["type"] for e in hook.acked(action["id"])] == ["payment_intent.requires_action",
                                                             "payment_intent.canceled"]


async def test_sync_timeout_charges_once(make_psp, wait_for):
    psp, hook = await make_psp()
    with pytest.raises(ApiError) as err:
        await psp.create_intent("k", body("pm_card_sync_timeout"))
    assert err.value.status == 504
    again = await psp.create_intent("k", body("pm_card_sync_timeout"))
    assert again["status"] == "succeeded"
    assert psp.store.ledger()["charge_count_by_key"] == {"k": 1}
    await wait_for(lambda: hook.acked(again["id"]))


async def test_refunds(make_psp, wait_for):
    psp, hook = await make_psp()
    intent = await psp.create_intent("k", body(amount=1000))
    r1 = psp.create_refund("r1", {"payment_intent": intent["id"], "amount": 400})
    assert (r1["amount"], r1["status"], r1["payment_intent"]) == (400, "succeeded", intent["id"])
    assert psp.create_refund("r1", {"payment_intent": intent["id"], "amount": 400})["id"] == r1["id"]
    with pytest.raises(ApiError) as err:
        psp.create_refund("r1", {"payment_intent": intent["id"], "amount": 300})
    assert err.value.status == 422
    with pytest.raises(ApiError) as err:
        psp.create_refund("r2", {"payment_intent": intent["id"], "amount": 601})
    assert (err.value.status, err.value.error["code"]) == (400, "amount_too_large")
    r2 = psp.create_refund("r2", {"payment_intent": intent["id"]})
    assert r2["amount"] == 600
    with pytest.raises(ApiError) as err:
        psp.create_refund("r3", {"payment_intent": intent["id"]})
    assert err.value.error["code"] == "charge_already_refunded"
    assert psp.get_intent(intent["id"])["amount_refunded"] == 1000
    ledger = psp.store.ledger()
    assert [r["amount"] for r in ledger["refunds"]] == [400, 600]
    assert ledger["totals_by_currency"] == {"TRY": {"charged": 1000, "refunded": 1000}}
    await wait_for(lambda: len(hook.acked(r1["payment_intent"])) >= 1)
    await wait_for(lambda: sum(e["type"] == "charge.refunded" for e in hook.acked()) == 2)


async def test_refund_refused_for_unpaid_or_unknown(make_psp):
    psp, _ = await make_psp()
    declined = await psp.create_intent("k", body("pm_card_declined"))
    with pytest.raises(ApiError) as err:
        psp.create_refund("r", {"payment_intent": declined["id"]})
    assert err.value.status == 400 and err.value.error["payment_intent"]["status"] == "failed"
    with pytest.raises(ApiError) as err:
        psp.create_refund("r", {"payment_intent": "pi_nope"})
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        psp.create_refund(None, {"payment_intent": declined["id"]})
    assert err.value.status == 400


async def test_faults(make_psp):
    psp, _ = await make_psp()
    assert psp.set_faults({"fail_next_creates": 2, "fail_next_retrieves": 1})["fail_next_creates"] == 2
    for _ in range(2):
        with pytest.raises(ApiError) as err:
            await psp.create_intent("k", body())
        assert err.value.status == 503
    intent = await psp.create_intent("k", body())
    with pytest.raises(ApiError):
        psp.get_intent(intent["id"])
    assert psp.get_intent(intent["id"])["status"] == "succeeded"
    assert psp.store.ledger()["charge_count_by_key"] == {"k": 1}
    for bad in ({"fail_next_creates": -1}, {"fail_next_creates": "2"}, {"explode": 1}):
        with pytest.raises(ApiError):
            psp.set_faults(bad)


async def test_reset_cancels_pending_deliveries(make_psp):
    psp, hook = await make_psp(webhook_delay_ms=60_000)
    await psp.create_intent("k", body())
    psp.reset()
    await asyncio.sleep(0)  # let cancellations run
    assert psp.store.intents == {} and psp.webhooks.snapshot() == [] and hook.deliveries == []


async def test_gives_up_after_max_attempts(make_psp, wait_for):
    psp, hook = await make_psp(webhook_max_attempts=4)
    hook.status_for = lambda event, attempt: 500
    intent = await psp.create_intent("k", body())
    await wait_for(lambda: psp.webhooks.snapshot() and psp.webhooks.snapshot()[0]["gave_up"] == 1)
    [stats] = psp.webhooks.snapshot()
    assert stats["attempts"] == 4 and stats["acknowledged"] == 0 and stats["last_status"] == 500
    assert stats["object_id"] == intent["id"]


def test_backoff_is_exponential_capped_and_jittered():
    d = WebhookDispatcher(Settings(webhook_retry_base_seconds=0.2, webhook_retry_cap_seconds=10),
                          rng=random.Random(7))
    for attempt in range(1, 15):
        full = min(10, 0.2 * 2 ** (attempt - 1))
        samples = [d.backoff(attempt) for _ in range(50)]
        assert all(full / 2 <= s <= full for s in samples)
        assert len(set(samples)) > 1


async def test_a_card_saved_at_purchase_is_charged_off_session_once_per_key(make_psp, wait_for):
    psp, hook = await make_psp()
    purchase = await psp.create_intent("buy", body(setup_future_usage="off_session"))
    assert purchase["status"] == "succeeded"
    pm, customer = purchase["saved_payment_method"], purchase["customer"]
    assert pm.startswith("pm_saved_") and customer.startswith("cus_")
    # Without the setup flag nothing is saved.
    plain = await psp.create_intent("plain", body())
    assert plain["saved_payment_method"] is None and plain["customer"] is None
    fee = {"amount": 500, "currency": "TRY", "payment_method": pm, "customer": customer, "off_session": True}
    a = await psp.create_intent("fee", fee)
    b = await psp.create_intent("fee", fee)
    assert a["id"] == b["id"] and a["status"] == "succeeded" and a["off_session"] is True
    assert psp.store.ledger()["charge_count_by_key"] == {"buy": 1, "plain": 1, "fee": 1}
    await wait_for(lambda: hook.acked(a["id"]), what="the off-session charge's webhook")
    # Another customer's id, or a method never saved: 404, nothing charged.
    for other in ({**fee, "customer": "cus_other"}, {**fee, "payment_method": "pm_saved_nope"}):
        with pytest.raises(ApiError) as err:
            await psp.create_intent("fee-" + other["customer"] + other["payment_method"], other)
        assert (err.value.status, err.value.error["param"]) == (404, "payment_method")
    assert len(psp.store.ledger()["charges"]) == 3


async def test_a_saved_card_can_be_declined_off_session(make_psp, wait_for):
    psp, hook = await make_psp()
    purchase = await psp.create_intent("buy", body(pm="pm_card_off_session_declined", setup_future_usage="off_session"))
    assert purchase["status"] == "succeeded"
    fee = await psp.create_intent("fee", {"amount": 500, "currency": "TRY", "off_session": True,
                                          "payment_method": purchase["saved_payment_method"],
                                          "customer": purchase["customer"]})
    assert fee["status"] == "failed" and fee["last_payment_error"]["decline_code"] == "insufficient_funds"
    await wait_for(lambda: hook.acked(fee["id"]), what="the decline's webhook")
    assert [d["event"]["type"] for d in hook.deliveries if d["event"]["data"]["object"]["id"] == fee["id"]] == [
        "payment_intent.payment_failed"]
    assert psp.store.ledger()["charge_count_by_key"] == {"buy": 1}
