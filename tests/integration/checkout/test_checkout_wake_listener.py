"""The saga worker's LISTEN (cutylib.listen): a payment's change wakes its saga at once, and a worker
whose listening connection is killed still notices, without waiting for its poll: it claims on the
loss and once listening again (what it may have missed), and hears the next NOTIFY on the new one."""
from __future__ import annotations

import dataclasses
import uuid

from cutylib.testing.procs import wait_for
from payments.checkout.domain import validate_create
from payments.checkout.repository import WAKE_CHANNEL

C = "listener-" + uuid.uuid4().hex[:8]
LISTENING = f"LISTEN \"{WAKE_CHANNEL}\""
# Far longer than any wait below: whatever the worker does in time, a NOTIFY (or the loss) made it.
POLL_SECONDS = 120.0


async def _listeners(h) -> list[int]:
    return [r["pid"] for r in await h.pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = $1", LISTENING)]


async def _awaiting_action(h):
    created = await h.service.create(C, validate_create(h.booking.add_slot(price=4200), "", 0), "")
    paid = await h.service.pay(C, created.id, "pm_card_3ds", "")
    return created.id, paid.payment.id


async def _completed(h, checkout_id) -> bool:
    return (await h.row(checkout_id))["state"] == "COMPLETED"


async def _captured(h, payment_id) -> None:
    pi = (await h.core.get(payment_id)).psp_intent_id
    await h.core.finalize(payment_id, "succeeded", "webhook", intent=h.psp.set_status(pi))


async def test_a_worker_whose_listening_connection_is_killed_still_notices_payment_changes(make_harness):
    h = make_harness()
    h.options = dataclasses.replace(h.options, poll_seconds=POLL_SECONDS)
    h.start_workers(1)
    await wait_for(lambda: _listeners(h), timeout=10, message="the worker listens")
    [first_pid] = await _listeners(h)

    # Heard: the webhook's finalize NOTIFYs, the idle worker claims at once.
    heard, heard_payment = await _awaiting_action(h)
    await _captured(h, heard_payment)
    await wait_for(lambda: _completed(h, heard), timeout=10, message="woken by NOTIFY")

    # The listening backend dies and the payment changes right away, likely before it listens again:
    # the worker was told it may have missed a wake-up and claims.
    missed, missed_payment = await _awaiting_action(h)
    assert await h.pool.fetchval("SELECT pg_terminate_backend($1)", first_pid)
    await _captured(h, missed_payment)
    await wait_for(lambda: _completed(h, missed), timeout=10, message="noticed across the lost connection")

    # Listening again on another connection, where the next NOTIFY is heard.
    async def relistened():
        pids = await _listeners(h)
        return pids and first_pid not in pids
    await wait_for(relistened, timeout=10, message="the worker listens again")
    later, later_payment = await _awaiting_action(h)
    await _captured(h, later_payment)
    await wait_for(lambda: _completed(h, later), timeout=10, message="woken by NOTIFY after the reconnect")
