"""A PSP webhook about a payment that is already final (the common case: the synchronous answer
captured it first) costs one statement and no saga work (docs/payments.md, "Webhooks")."""
from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid

from cuty.payments.v1 import checkout_pb2 as pb
from cutylib.testing.procs import wait_for
from payments import signature
from payments.checkout.domain import validate_create
from payments.checkout.repository import WAKE_CHANNEL, WATCH_CHANNEL
from payments.metrics import PaymentsMetrics
from payments.service import PaymentsCore
from payments.settings import PaymentsOptions
from payments.webhooks import WebhookInbox

SECRET = "whsec_final"
STATEMENTS = ("fetch", "fetchrow", "fetchval", "execute", "executemany", "acquire", "transaction")


class CountingPool:
    """The pool, counting what is asked of it (a statement, or a connection for several)."""

    def __init__(self, pool):
        self.pool = pool
        self.asked: list[str] = []

    def __getattr__(self, name):
        attr = getattr(self.pool, name)
        if name not in STATEMENTS:
            return attr

        def counted(*args, **kw):
            self.asked.append(name if name in ("acquire", "transaction") else args[0])
            return attr(*args, **kw)
        return counted


def delivery(event_type: str, obj: dict) -> tuple[bytes, str]:
    body = json.dumps({"id": f"evt_{secrets.token_hex(10)}", "object": "event", "type": event_type,
                       "created": int(time.time()), "data": {"object": obj}}).encode()
    return body, signature.sign(SECRET, body)


async def test_a_webhook_for_a_final_payment_is_one_statement_and_wakes_no_saga(harness):
    h = harness
    done = await h.service.create(f"c-{uuid.uuid4()}", validate_create(h.booking.add_slot(), "", 0, "pm_card_ok"), "")
    assert done.state == pb.CHECKOUT_STATE_COMPLETED
    intent = dict(h.psp.intents[(await h.core.get(done.payment.id)).psp_intent_id])
    counting = CountingPool(h.pool)
    inbox = WebhookInbox(PaymentsCore(h.settings, counting, h.psp, options=PaymentsOptions(),
                                      metrics=PaymentsMetrics(), worker_id="webhooks"), [SECRET])
    checkout_before = await h.row(done.id)
    payment_before = await h.pool.fetchrow("SELECT * FROM payments WHERE id = $1", uuid.UUID(done.payment.id))
    events_before = await h.pool.fetchval("SELECT count(*) FROM payment_events WHERE checkout_id = $1",
                                          uuid.UUID(done.id))
    heard: list[str] = []
    listener = await h.pool.acquire()
    try:
        for channel in (WAKE_CHANNEL, WATCH_CHANNEL):
            await listener.add_listener(channel, lambda _c, _pid, ch, payload: heard.append(f"{ch}:{payload}"))
        # The usual capture webhook, then late, out-of-order ones: all old news to a succeeded payment.
        gets = h.psp.calls["get"]
        for event_type, status in (("payment_intent.succeeded", "succeeded"),
                                   ("payment_intent.processing", "processing"),
                                   ("payment_intent.requires_action", "requires_action")):
            body, header = delivery(event_type, {**intent, "status": status})
            counting.asked.clear()
            assert await inbox.handle(body, header) == "processed"
            assert len(counting.asked) == 1, counting.asked  # RESOLVE_AND_STORE, nothing else
            counting.asked.clear()
            assert await inbox.handle(body, header) == "duplicate"  # the PSP's retry of it
            assert len(counting.asked) == 1, counting.asked
            row = await h.pool.fetchrow("SELECT status, attempts, next_attempt_at FROM psp_events "
                                        "WHERE event_id = $1", json.loads(body)["id"])
            assert (row["status"], row["attempts"], row["next_attempt_at"]) == ("processed", 0, None)
        await asyncio.sleep(0.3)  # a NOTIFY would be delivered by now
    finally:
        await listener.reset()
        await h.pool.release(listener)
    assert heard == []
    assert h.psp.calls["get"] == gets  # the PSP was not asked
    assert dict(await h.row(done.id)) == dict(checkout_before)
    assert dict(await h.pool.fetchrow("SELECT * FROM payments WHERE id = $1",
                                      uuid.UUID(done.payment.id))) == dict(payment_before)
    assert await h.pool.fetchval("SELECT count(*) FROM payment_events WHERE checkout_id = $1",
                                 uuid.UUID(done.id)) == events_before


async def test_a_webhook_with_news_still_takes_the_finalize_path(harness):
    """The contrast: a capture reported while the payment waits for 3-D Secure moves it (and wakes
    its saga), through the lease and finalize."""
    h = harness
    h.start_workers(1)
    waiting = await h.service.create(f"c-{uuid.uuid4()}", validate_create(h.booking.add_slot(), "", 0, "pm_card_3ds"),
                                     "")
    assert waiting.state == pb.CHECKOUT_STATE_AWAITING_ACTION
    pi = (await h.core.get(waiting.payment.id)).psp_intent_id
    inbox = WebhookInbox(h.core, [SECRET])
    body, header = delivery("payment_intent.succeeded", h.psp.set_status(pi))
    assert await inbox.handle(body, header) == "processed"
    assert (await h.core.get(waiting.payment.id)).status == "succeeded"

    async def completed():
        return (await h.row(waiting.id))["state"] == "COMPLETED"
    await wait_for(completed, timeout=5, message="the saga woken by the capture")
