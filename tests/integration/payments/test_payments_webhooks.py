"""HandlePspWebhook over real gRPC and PostgreSQL: signatures, bad input, dedupe, leases, deferral."""
import asyncio
import json
import time

import grpc
import pytest

from cuty.payments.v1 import payments_pb2 as pb
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.testing.ids import new_id
from cutylib.testing.procs import wait_for
from payments import signature

from payments_events import PREVIOUS_SECRET, WEBHOOK_SECRET, event, signed
from cutylib.testing.trust import TEST_MERCHANT


async def three_ds(core):
    return await core.create_and_charge(checkout_id=new_id(), amount_minor=700, currency="EUR",
                                        payment_method="pm_card_3ds", idempotency_key=new_id(), customer_id="c",
                                        merchant_id=TEST_MERCHANT)


async def stored(pool, event_id: str):
    return await pool.fetchrow("SELECT status, payment_id, attempts FROM psp_events WHERE event_id = $1", event_id)


async def transitions_to(pool, payment_id: str, status: str) -> int:
    return await pool.fetchval("SELECT count(*) FROM payment_events WHERE payment_id = $1 AND to_status = $2",
                               payment_id, status)


def _sig(t: int, v1: str) -> str:
    return f"t={t},v1={v1}"


BAD_SIGNATURES = {
    "missing": lambda body: None,
    "empty": lambda body: "",
    "garbage": lambda body: "not a signature",
    "no timestamp": lambda body: "v1=" + signature.expected(WEBHOOK_SECRET, body, int(time.time())),
    "no v1": lambda body: f"t={int(time.time())}",
    "non-numeric t": lambda body: _sig(0, "0" * 64).replace("t=0", "t=12a"),
    "short v1": lambda body: _sig(int(time.time()), "abc"),
    "wrong secret": lambda body: signature.sign("whsec_wrong", body),
    "other body": lambda body: signature.sign(WEBHOOK_SECRET, body + b" "),
    # a minute past the tolerance either way: at one second past it, a check made in the next
    # wall-clock second (the signed time is whole seconds) would find the "future" one within it
    "stale": lambda body: signature.sign(WEBHOOK_SECRET, body, int(time.time()) - signature.TOLERANCE_SECONDS - 60),
    "future": lambda body: signature.sign(WEBHOOK_SECRET, body, int(time.time()) + signature.TOLERANCE_SECONDS + 60),
}


@pytest.mark.parametrize("case", sorted(BAD_SIGNATURES))
async def test_bad_signature_is_refused_and_nothing_stored(payments_server, payments_pool, core, fake_psp, case):
    p = await three_ds(core)
    evt_id = f"evt_{new_id()}"
    body = event("payment_intent.succeeded", fake_psp.set_status(p.psp_intent_id, "succeeded"), event_id=evt_id)
    header = BAD_SIGNATURES[case](body)
    md = () if header is None else (("cuty-signature", header),)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=md)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_reason(e.value).startswith("signature-")
    assert await stored(payments_pool, evt_id) is None
    assert (await core.get(p.id)).status == "requires_action"


@pytest.mark.parametrize("header", [
    lambda body: signature.sign(PREVIOUS_SECRET, body),  # rotation: the previous secret still verifies
    lambda body: signature.sign(WEBHOOK_SECRET, body, int(time.time()) - 290),  # inside the window
    lambda body: signature.sign(WEBHOOK_SECRET, body, int(time.time()) + 290),
    lambda body: (lambda t: f"t={t},v1={'0' * 64},v1={signature.expected(WEBHOOK_SECRET, body, t)}")(int(time.time())),
])
async def test_valid_signatures_are_accepted(payments_server, payments_pool, core, fake_psp, header):
    p = await three_ds(core)
    body = event("payment_intent.succeeded", fake_psp.set_status(p.psp_intent_id, "succeeded"))
    resp = await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body),
                                                  metadata=(("cuty-signature", header(body)),))
    assert resp.result == "processed"
    assert (await core.get(p.id)).status == "succeeded"


@pytest.mark.parametrize("body, field", [
    (b"{not json", "payload"),
    (b"\xff\xfe", "payload"),
    (b"[1, 2]", "payload"),
    (json.dumps({"type": "payment_intent.succeeded", "data": {"object": {}}}).encode(), "payload.id"),
    (json.dumps({"id": "evt_x", "type": "payment_intent.succeeded"}).encode(), "payload.data.object"),
    # An object naming no intent would slip past finalize's "same intent" check.
    (json.dumps({"id": "evt_x", "type": "payment_intent.succeeded",
                 "data": {"object": {"status": "succeeded", "metadata": {"payment_id": "x"}}}}).encode(),
     "payload.data.object.id"),
    (json.dumps({"id": "evt_x", "type": "charge.refunded",
                 "data": {"object": {"object": "refund", "status": "succeeded"}}}).encode(),
     "payload.data.object.payment_intent"),
])
async def test_malformed_body_with_good_signature_is_invalid_and_not_stored(payments_server, payments_pool, body, field):
    before = await payments_pool.fetchval("SELECT count(*) FROM psp_events")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=signed(WEBHOOK_SECRET, body))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == field
    assert await payments_pool.fetchval("SELECT count(*) FROM psp_events") == before


async def test_event_for_unknown_payment_is_stored_ignored_and_acknowledged(payments_server, payments_pool):
    evt_id = f"evt_{new_id()}"
    body = event("payment_intent.succeeded", {"id": f"pi_{new_id()}", "status": "succeeded",
                                              "metadata": {"payment_id": new_id()}}, event_id=evt_id)
    resp = await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=signed(WEBHOOK_SECRET, body))
    assert resp.result == "ignored"
    row = await stored(payments_pool, evt_id)
    assert (row["status"], row["payment_id"]) == ("ignored", None)
    again = await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=signed(WEBHOOK_SECRET, body))
    assert again.result == "duplicate"


async def test_fifty_concurrent_copies_make_one_transition(payments_server, payments_pool, core, fake_psp):
    p = await three_ds(core)
    body = event("payment_intent.succeeded", fake_psp.set_status(p.psp_intent_id, "succeeded"))
    results = await asyncio.gather(*(
        payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=signed(WEBHOOK_SECRET, body))
        for _ in range(50)))
    assert sorted(r.result for r in results) == ["duplicate"] * 49 + ["processed"]
    assert await transitions_to(payments_pool, p.id, "succeeded") == 1
    view = await core.get(p.id)
    assert (view.status, view.version, view.redirect_url, view.client_secret) == ("succeeded", 3, None, None)


async def test_fifty_distinct_events_racing_for_the_lease_all_end_processed(payments_server, payments_pool, core,
                                                                             fake_psp):
    p = await three_ds(core)
    intent = fake_psp.set_status(p.psp_intent_id, "succeeded")
    bodies = [event("payment_intent.succeeded", intent) for _ in range(25)]
    bodies += [event("payment_intent.processing", {**intent, "status": "processing"}) for _ in range(25)]
    results = await asyncio.gather(*(
        payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=b), metadata=signed(WEBHOOK_SECRET, b))
        for b in bodies))
    assert {r.result for r in results} <= {"processed", "deferred"}
    ids = [json.loads(b)["id"] for b in bodies]

    async def all_done():
        rows = await payments_pool.fetch("SELECT status FROM psp_events WHERE event_id = ANY($1)", ids)
        return all(r["status"] == "processed" for r in rows)
    await wait_for(all_done, timeout=15, message="deferred events finished by the retry worker")
    assert await transitions_to(payments_pool, p.id, "succeeded") == 1
    events = await core.timeline(p.id)
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert (await core.get(p.id)).status == "succeeded"


async def test_lease_held_elsewhere_defers_then_retry_worker_finishes(payments_server, payments_pool, make_core,
                                                                      fake_psp):
    holder = make_core(lease_seconds=30)
    p = await three_ds(holder)
    assert await holder.take_lease(p.id)
    evt_id = f"evt_{new_id()}"
    body = event("payment_intent.succeeded", fake_psp.set_status(p.psp_intent_id, "succeeded"), event_id=evt_id)
    resp = await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=signed(WEBHOOK_SECRET, body))
    assert resp.result == "deferred"
    assert (await stored(payments_pool, evt_id))["status"] == "deferred"
    assert (await holder.get(p.id)).status == "requires_action"
    await holder.release_lease(p.id)
    await wait_for(lambda: _status(payments_pool, evt_id, "processed"), timeout=10, message="deferred event processed")
    assert (await holder.get(p.id)).status == "succeeded"


async def _status(pool, evt_id, status):
    return (await stored(pool, evt_id))["status"] == status


async def test_contradicting_event_is_settled_by_asking_the_psp(payments_server, payments_pool, core, fake_psp):
    p = await three_ds(core)
    succeeded = fake_psp.set_status(p.psp_intent_id, "succeeded")
    await core.finalize(p.id, "succeeded", "sync", intent=succeeded)
    gets = fake_psp.calls["get"]
    body = event("payment_intent.payment_failed", {**succeeded, "status": "failed"})
    resp = await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=signed(WEBHOOK_SECRET, body))
    assert resp.result == "processed"
    assert fake_psp.calls["get"] == gets + 1
    assert (await core.get(p.id)).status == "succeeded"
    assert await transitions_to(payments_pool, p.id, "failed") == 0


async def test_webhook_before_sync_answer_finds_the_payment_and_learns_the_intent(payments_server, payments_pool,
                                                                                 core, fake_psp):
    fake_psp.unavailable["create"] = 1  # our create "timed out": the row stays created, intent id unknown
    key = new_id()
    p = await core.create_and_charge(checkout_id=None, amount_minor=100, currency="TRY", payment_method="pm_card_ok",
                                     idempotency_key=key, customer_id="c", merchant_id=TEST_MERCHANT)
    assert (p.status, p.psp_intent_id) == ("created", None)
    intent = await fake_psp.create_intent(key, {"amount": 100, "currency": "TRY", "payment_method": "pm_card_ok",
                                                "metadata": {"payment_id": p.id}})
    body = event("payment_intent.succeeded", intent, key=key)
    resp = await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=signed(WEBHOOK_SECRET, body))
    assert resp.result == "processed"
    view = await core.get(p.id)
    assert (view.status, view.psp_intent_id, view.version) == ("succeeded", intent["id"], 2)
    assert fake_psp.charges[key] == 1


async def test_event_left_received_by_a_crashed_handler_is_finished_by_the_retry_worker(
        payments_server, payments_pool, core, fake_psp):
    p = await three_ds(core)
    evt_id = f"evt_{new_id()}"
    body = json.loads(event("payment_intent.succeeded", fake_psp.set_status(p.psp_intent_id, "succeeded"),
                            event_id=evt_id))
    # What a process killed between storing and finalizing leaves behind.
    await payments_pool.execute(
        "INSERT INTO psp_events (event_id, type, payment_id, payload, status, next_attempt_at)"
        " VALUES ($1, $2, $3, $4, 'received', clock_timestamp() - interval '1 second')",
        evt_id, body["type"], p.id, body)
    await wait_for(lambda: _status(payments_pool, evt_id, "processed"), timeout=10, message="retry worker finishing it")
    assert (await core.get(p.id)).status == "succeeded"
    assert (await stored(payments_pool, evt_id))["attempts"] == 1


# -- No secrets at rest in psp_events -------------------------------------------

async def test_stored_events_keep_no_client_secret_or_redirect(payments_server, payments_pool, core, fake_psp):
    p = await three_ds(core)
    intent = fake_psp.set_status(p.psp_intent_id, "requires_action")
    assert intent["client_secret"] and intent["next_action"]["redirect_url"]
    evt_id = f"evt_{new_id()}"
    body = event("payment_intent.requires_action", intent, event_id=evt_id)
    await payments_server.HandlePspWebhook(pb.PspWebhookRequest(payload=body), metadata=signed(WEBHOOK_SECRET, body))
    text = await payments_pool.fetchval("SELECT payload::text FROM psp_events WHERE event_id = $1", evt_id)
    assert intent["client_secret"] not in text and intent["next_action"]["redirect_url"] not in text
    assert '"status": "requires_action"' in text  # the rest of the event is kept
    # the customer still gets the action from the payment while it is needed
    assert (await core.get(p.id)).client_secret == intent["client_secret"]

