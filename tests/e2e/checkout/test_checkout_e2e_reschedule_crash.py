"""Crash matrix of the reschedule: the orchestrator SIGKILLs itself at every step
of a reschedule (CUTY_CRASH_AT: the new hold, the difference's charge, the new hold's confirm, the
old booking's release, a decrease's refund, an undone reschedule's release of the new hold, right
after the moves that commit a step) and is restarted; the client retries with the same
Idempotency-Key. Every booking must end COMPLETED on exactly one slot (never both lost, never both
kept), the PSP must have kept exactly the booked slot's price (charges minus refunds over all the
checkout's payments), charged each attempt once, and the outbox must hold booking.rescheduled once
per reschedule that succeeded.

One incarnation per crash point, as in test_checkout_e2e_crash_matrix.py: the process armed with
point i+1 also finishes what the crash at point i left behind."""
from __future__ import annotations

import uuid

import pytest_asyncio


from checkout_e2e import CheckoutStack, crash_at_each_point, persist, start_stack

PROC = "payments-0"


async def reschedule(shop: CheckoutStack, *, new_price: int, method: str = "") -> tuple[str, str]:
    """Buy slot A (75000), then reschedule it to B (`new_price`) through the crashes. (checkout, B)"""
    who = f"rc-{uuid.uuid4().hex[:8]}"
    (a,) = await shop.new_slots(1)
    (b,) = await shop.new_slots(1, price=new_price)
    ck, pk, rk = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    c = await persist(lambda: shop.create(who, slot=a, key=ck))
    await persist(lambda: shop.pay(who, c.id, "pm_card_ok", key=pk))
    await shop.until(c.id, timeout=30)
    await persist(lambda: shop.reschedule(who, c.id, b, method=method, key=rk), timeout=60)
    return c.id, b


def same(shop):
    return reschedule(shop, new_price=75000)


def dearer(shop):
    return reschedule(shop, new_price=90000)


def cheaper(shop):
    return reschedule(shop, new_price=50000)


def declined(shop):
    return reschedule(shop, new_price=90000, method="pm_card_declined")


MATRIX = [
    ("reschedule_hold:before", same), ("reschedule_hold:after", same),
    ("reschedule_charge:before", dearer), ("reschedule_charge:after", dearer),
    ("recorded:RESCHEDULE_CONFIRMING", dearer),
    ("reschedule_confirm:before", dearer), ("reschedule_confirm:after", dearer),
    ("reschedule_release:before", same), ("reschedule_release:after", cheaper),
    ("reschedule_refund:before", cheaper), ("reschedule_refund:after", cheaper),
    ("recorded:RESCHEDULE_REVERTING", declined),
    ("reschedule_unhold:before", declined), ("reschedule_unhold:after", declined),
]


@pytest_asyncio.fixture(scope="module")
async def crashy(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("reschedule-crash"))
    yield s
    await s.close()


async def test_sigkill_at_every_reschedule_step_then_recover(crashy):
    shop = crashy
    outcomes = await crash_at_each_point(shop, MATRIX, PROC, timeout=60)
    results = dict(zip([p for p, _ in MATRIX], outcomes))
    for cid, _ in results.values():
        await shop.until(cid, timeout=60)
    rows = await shop.check_reschedules([cid for cid, _ in results.values()])
    for point, (cid, new_slot) in results.items():
        row = rows[cid]
        if point.startswith("reschedule_unhold") or point == "recorded:RESCHEDULE_REVERTING":
            assert (row["reschedule_status"], row["reschedule_failure"]) == ("reverted", "payment-failed"), point
            assert str(row["slot_id"]) != new_slot and row["reschedules"] == 0, point
        else:
            assert row["reschedule_status"] == "rescheduled" and str(row["slot_id"]) == new_slot, point
            assert row["reschedules"] == 1, point
    await shop.check_outbox()
