"""Two orchestrator replicas with short holds (2 s + a 1 s extension; code reservations 3 s):
expiry of unpaid checkouts, late capture both ways, cancel, and replicas racing on one saga."""
from __future__ import annotations

import asyncio
import json
import random
import uuid

import pytest
import pytest_asyncio

from cuty.booking.v1 import booking_pb2 as bpb
from cuty.payments.v1 import checkout_pb2 as pb
from cutylib.testing.procs import wait_for

from checkout_e2e import name, start_stack


@pytest_asyncio.fixture(scope="module")
async def twins(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("checkout-twins"), replicas=2,
                          # short enough for the expiry tests, long enough that 24 purchases at
                          # once on a loaded machine (parallel test workers) pay before it
                          CUTY_HOLD_TTL_SECONDS=5, CUTY_HOLD_MAX_EXTENSION_SECONDS=1,
                          CUTY_CODE_RESERVATION_TTL_SECONDS=6)
    yield s
    await s.close()


def completions(log: str, ids: set[str]) -> int:
    """How many of `ids` this replica's log says it completed."""
    n = 0
    for line in log.splitlines():
        if "CHARGING -> COMPLETED" in line or "CONFIRMING -> COMPLETED" in line:
            n += json.loads(line).get("checkout_id") in ids
    return n


def who() -> str:
    return f"buyer-{uuid.uuid4().hex[:8]}"


async def intent_of(shop, checkout_id: str) -> str:
    return await shop.db["payments"].fetchval(
        "SELECT p.psp_intent_id FROM payments p WHERE p.checkout_id = $1", uuid.UUID(checkout_id))


async def test_unpaid_checkouts_expire_and_give_everything_back(twins):
    shop, me = twins, who()
    (slot,) = await shop.new_slots(1)
    product = await shop.new_product(stock=2)
    booked = await shop.create(me, slot=slot)
    coded = await shop.create(me, product=product, quantity=2)
    three_ds = await shop.create(me, slot=(await shop.new_slots(1))[0])
    waiting = await shop.pay(me, three_ds.id, "pm_card_3ds")
    assert waiting.state == pb.CHECKOUT_STATE_AWAITING_ACTION
    for c in (booked, coded, three_ds):
        assert (await shop.until(c.id, timeout=30)).state == pb.CHECKOUT_STATE_EXPIRED
    assert await shop.hold_status(booked.hold_id) in ("released", "expired")
    assert await shop.order_status(coded.id) == "released"
    assert await shop.db["codepool"].fetchval(
        "SELECT count(*) FROM codes WHERE product_id = $1 AND status = 'available'", uuid.UUID(product)) == 2
    # The customer never finished 3-D Secure: the intent was cancelled at the PSP, nothing charged.
    intent = (await shop.psp("GET", f"{shop.stack.psp_url}/v1/payment_intents/{await intent_of(shop, three_ds.id)}"))
    assert intent.json()["status"] == "canceled"
    final = await shop.get(three_ds.id, me)
    assert not final.payment.next_action.redirect_url and not final.payment.client_secret
    await shop.check_invariants([booked.id, coded.id, three_ds.id])


@pytest.mark.parametrize("slot_taken,final", [(True, pb.CHECKOUT_STATE_REFUNDED), (False, pb.CHECKOUT_STATE_COMPLETED)])
async def test_late_capture(twins, slot_taken, final):
    """The money arrives after the hold ran out: the orchestrators are frozen (SIGSTOP) while the
    hold expires and the customer completes 3-D Secure. When they wake, whichever comes first (the
    webhook, or the expiry's cancel that the PSP answers with "succeeded") leads to confirm: a free
    slot is re-held and completed; a slot someone else took is refunded at once."""
    shop, me = twins, who()
    (slot,) = await shop.new_slots(1)
    c = await shop.create(me, slot=slot)
    assert (await shop.pay(me, c.id, "pm_card_3ds")).state == pb.CHECKOUT_STATE_AWAITING_ACTION
    replicas = [p for n, p in shop.stack.procs.items() if n.startswith("payments-")]
    for p in replicas:
        p.pause()
    try:
        expired = "SELECT expires_at < clock_timestamp() FROM holds WHERE id = $1"
        await wait_for(lambda: shop.db["booking"].fetchval(expired, uuid.UUID(c.hold_id)), timeout=10,
                       message="the hold to run out")
        if slot_taken:
            rival = await shop.booking.HoldSlot(bpb.HoldSlotRequest(slot_id=slot, customer_id="rival",
                                                                   request_id=str(uuid.uuid4())))
            assert rival.status == bpb.HOLD_STATUS_HELD
        done = await shop.psp("GET", f"{shop.stack.psp_url}/3ds/{await intent_of(shop, c.id)}/complete")
        assert done.json()["status"] == "succeeded"
    finally:
        for p in replicas:
            p.resume()
    end = await shop.until(c.id, timeout=15)
    assert end.state == final, name(end.state)
    states = await shop.check_invariants([c.id])
    assert states[c.id] == name(final)
    ledger = await shop.ledger()
    refunds = [r for r in ledger["refunds"] if r["intent_id"] == await intent_of(shop, c.id)]
    assert len(refunds) == (1 if slot_taken else 0)


async def test_cancel(twins):
    shop, me = twins, who()
    held = await shop.create(me, slot=(await shop.new_slots(1))[0])
    assert (await shop.cancel(me, held.id)).state == pb.CHECKOUT_STATE_CANCELLED
    assert await shop.hold_status(held.hold_id) == "released"
    three_ds = await shop.create(me, product=await shop.new_product(stock=1), quantity=1)
    await shop.pay(me, three_ds.id, "pm_card_3ds")
    out = await shop.cancel(me, three_ds.id, replica=1)
    assert out.state == pb.CHECKOUT_STATE_CANCELLED and not out.payment.next_action.redirect_url
    assert await shop.order_status(three_ds.id) == "released"
    await shop.check_invariants([held.id, three_ds.id])


async def test_two_replicas_never_do_a_step_twice(twins):
    """Requests alternate between the replicas, webhooks are relayed round-robin, and both workers
    hear every wake-up: each saga transition, charge, confirm and delivery happens once."""
    shop, rng = twins, random.Random(11)
    slots = await shop.new_slots(12)
    product = await shop.new_product(stock=24)

    async def purchase(i: int) -> str:
        me, r = who(), i % 2
        if i % 2:
            c = await shop.create(me, product=product, quantity=2, replica=r)
        else:
            c = await shop.create(me, slot=slots[i // 2], replica=r)
        method = rng.choice(["pm_card_ok", "pm_card_3ds", "pm_card_duplicate_webhooks", "pm_card_webhook_first"])
        paid = await shop.pay(me, c.id, method, replica=1 - r)
        if paid.state == pb.CHECKOUT_STATE_AWAITING_ACTION:
            await shop.psp("GET", paid.payment.next_action.redirect_url)
        return c.id

    ids = await asyncio.gather(*(purchase(i) for i in range(24)))
    for cid in ids:
        assert (await shop.until(cid, timeout=15)).state == pb.CHECKOUT_STATE_COMPLETED
    await shop.check_invariants(ids)
    dupes = await shop.db["payments"].fetch(
        "SELECT checkout_id, from_status, to_status, count(*) FROM payment_events "
        "WHERE source = 'saga' AND checkout_id = ANY($1::uuid[]) GROUP BY 1, 2, 3 HAVING count(*) > 1", ids)
    assert dupes == []
    hold_ids = await shop.db["payments"].fetch("SELECT hold_id FROM checkouts WHERE id = ANY($1::uuid[]) "
                                               "AND hold_id IS NOT NULL", ids)
    holds = await shop.db["booking"].fetch("SELECT status, payment_ref FROM holds WHERE id = ANY($1::uuid[])",
                                           [uuid.UUID(r["hold_id"]) for r in hold_ids])
    assert len(holds) == 12 and all(h["status"] == "confirmed" for h in holds)
    delivered = await shop.db["codepool"].fetchval(
        "SELECT count(*) FROM deliveries WHERE order_id = ANY($1::text[]) AND status = 'delivered'", ids)
    assert delivered == 24  # 12 orders x 2 codes, each code once
    per_replica = [completions(p.tail(10**7), set(ids)) for n, p in shop.stack.procs.items()
                   if n.startswith("payments-")]
    assert sum(per_replica) == 24 and all(per_replica), per_replica  # both replicas did real work
