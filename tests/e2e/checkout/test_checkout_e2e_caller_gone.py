"""A buyer who stopped waiting is not charged, with the real services and the PSP simulator.

The request that asks for a payment (PayCheckout, or CreateCheckout with a payment method) records
its deadline with the payment attempt. When the charge cannot start before it (a dependency slow
before the charge, the orchestrator dying on the way), the worker that carries the saga on does
not start it: the holds go back and the checkout ends FAILED with `pay-deadline-passed`, and the
PSP never sees a charge. Once a charge has started it is finished as before (the crash matrices).
"""
from __future__ import annotations

import asyncio
import os
import signal
import uuid

import grpc
import pytest
import pytest_asyncio

from cuty.payments.v1 import checkout_pb2 as pb
from cutylib.testing.procs import wait_for

from checkout_e2e import md, start_stack


@pytest_asyncio.fixture(scope="module")
async def shop(pg, tmp_path_factory):
    # Every booking payment extends its hold first (booking.ExtendHold): the step before the charge
    # that a slow booking service holds up here.
    s = await start_stack(pg, tmp_path_factory.mktemp("checkout-e2e-caller-gone"),
                          CUTY_CHECKOUT_PAY_WINDOW_SECONDS=100_000)
    yield s
    await s.close()


async def nothing_charged(shop, checkout_id: str, charges_before: int) -> None:
    row = await shop.db["payments"].fetchrow("SELECT state, failure_reason, payment_id, pay_deadline "
                                             "FROM checkouts WHERE id = $1", uuid.UUID(checkout_id))
    assert (row["state"], row["failure_reason"], row["payment_id"]) == ("FAILED", "pay-deadline-passed", None)
    assert await shop.db["payments"].fetchval("SELECT count(*) FROM payments WHERE checkout_id = $1",
                                              uuid.UUID(checkout_id)) == 0
    assert len((await shop.ledger())["charges"]) == charges_before


async def test_a_pay_held_up_before_the_charge_past_its_deadline_is_never_charged(shop):
    slot = (await shop.new_slots(1))[0]
    me = f"gone-{uuid.uuid4().hex[:8]}"
    co = await shop.create(me, slot=slot)
    assert co.state == pb.CHECKOUT_STATE_HELD
    charges = len((await shop.ledger())["charges"])
    booking = shop.stack.procs["booking"].proc
    os.kill(booking.pid, signal.SIGSTOP)  # booking answers nothing: the extension before the charge waits
    try:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await shop.pay(me, co.id, "pm_card_ok", timeout=1.0)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.sleep(1.5)  # the buyer is gone; the saga's workers keep trying meanwhile
    finally:
        os.kill(booking.pid, signal.SIGCONT)
    done = await shop.until(co.id, timeout=60)
    assert done.state == pb.CHECKOUT_STATE_FAILED and done.failure_reason == "pay-deadline-passed", done
    # The buyer sees why, and the slot is free again for the next buyer.
    assert (await shop.get(co.id, me)).failure_reason == "pay-deadline-passed"
    await wait_for(lambda: _released(shop, done.hold_id), timeout=30, message="the hold released")
    await nothing_charged(shop, co.id, charges)
    again = await shop.create(f"next-{uuid.uuid4().hex[:8]}", slot=slot)
    assert again.state == pb.CHECKOUT_STATE_HELD


async def buy_until_crashed(shop, proc, request, metadata) -> None:
    """Ask for the one-call checkout with one key, as a buyer's client retries, until the orchestrator
    process dies at its crash point (each answer an error: the crash, or UNAVAILABLE while it starts);
    at most 60 s."""
    async def asking():
        while proc.proc.poll() is None:
            with pytest.raises(grpc.aio.AioRpcError):
                await shop.api().CreateCheckout(request, metadata=metadata, timeout=6.0)
            await asyncio.sleep(0.2)

    await asyncio.wait_for(asking(), timeout=60)


async def _released(shop, hold_id: str) -> bool:
    return await shop.hold_status(hold_id) in ("released", "expired")


async def test_a_one_call_checkout_whose_orchestrator_died_before_the_charge_is_not_charged_after_its_deadline(shop):
    product = await shop.new_product(stock=2, price=1500)
    me = f"gone-{uuid.uuid4().hex[:8]}"
    charges = len((await shop.ledger())["charges"])
    stack = shop.stack
    stack.procs["payments-0"].env["CUTY_CRASH_AT"] = "charge:before"
    try:
        await stack.restart("payments-0")
        proc = stack.procs["payments-0"]
        # The orchestrator is SIGKILLed just before the charge: the buyer's request fails. Its time
        # is ample for the charge to be reached even on a busy machine; it runs out while nobody runs.
        # Asked again with the same key while the restarted process is not serving yet (UNAVAILABLE
        # before it listens), as a buyer's client retries.
        key = str(uuid.uuid4())

        await buy_until_crashed(shop, proc, pb.CreateCheckoutRequest(product_id=product, quantity=1,
                                                                      payment_method="pm_card_ok"), md(me, key))
        assert '"crash_point": "charge:before"' in proc.tail(20000)
        row = await shop.db["payments"].fetchrow(
            "SELECT id, state, pay_deadline, extract(epoch FROM pay_deadline - clock_timestamp()) AS left_s "
            "FROM checkouts WHERE customer_id = $1", me)
        assert row["state"] == "CHARGING" and row["pay_deadline"] is not None, dict(row)
        await asyncio.sleep(max(0.0, float(row["left_s"])) + 0.2)  # its deadline passes while nobody runs it
    finally:
        stack.procs["payments-0"].env.pop("CUTY_CRASH_AT")
    await stack.restart("payments-0")
    checkout_id = str(row["id"])
    done = await shop.until(checkout_id, timeout=60)
    assert done.state == pb.CHECKOUT_STATE_FAILED and done.failure_reason == "pay-deadline-passed", done
    await nothing_charged(shop, checkout_id, charges)
    await wait_for(lambda: _order_released(shop, checkout_id), timeout=30, message="the codes released")
    # The codes went back: both can still be bought.
    bought = await shop.api().CreateCheckout(pb.CreateCheckoutRequest(product_id=product, quantity=2,
                                                                      payment_method="pm_card_ok"),
                                             metadata=md(me, str(uuid.uuid4())), timeout=10)
    assert bought.state == pb.CHECKOUT_STATE_COMPLETED, bought


async def _order_released(shop, order_id: str) -> bool:
    return await shop.order_status(order_id) in ("released", "expired")


@pytest.mark.parametrize("crash_at,left_in", [
    ("hold:after", "PENDING"),          # the slot held at booking, nothing recorded yet
    ("recorded:CHARGING", "CHARGING"),  # the hold recorded with the payment's start, no charge yet
])
async def test_a_one_call_booking_that_crashed_between_its_hold_and_its_charge_releases_the_slot(
        shop, crash_at, left_in):
    """A one-call checkout records its hold with its payment's start (PENDING -> CHARGING, one
    transition). A crash on either side of that write, before the charge, with the buyer gone by the
    time a worker carries the saga on: the slot goes back, nothing is charged."""
    slot = (await shop.new_slots(1))[0]
    me = f"gone-{uuid.uuid4().hex[:8]}"
    charges = len((await shop.ledger())["charges"])
    stack = shop.stack
    stack.procs["payments-0"].env["CUTY_CRASH_AT"] = crash_at
    try:
        await stack.restart("payments-0")
        proc = stack.procs["payments-0"]
        key = str(uuid.uuid4())

        await buy_until_crashed(shop, proc, pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_ok"),
                                md(me, key))
        assert f'"crash_point": "{crash_at}"' in proc.tail(20000)
        row = await shop.db["payments"].fetchrow(
            "SELECT id, state, payment_id, pay_deadline, extract(epoch FROM pay_deadline - clock_timestamp()) AS left_s "
            "FROM checkouts WHERE customer_id = $1", me)
        assert (row["state"], row["payment_id"]) == (left_in, None) and row["pay_deadline"] is not None, dict(row)
        await asyncio.sleep(max(0.0, float(row["left_s"])) + 0.2)  # its deadline passes while nobody runs it
    finally:
        stack.procs["payments-0"].env.pop("CUTY_CRASH_AT")
    await stack.restart("payments-0")
    checkout_id = str(row["id"])
    done = await shop.until(checkout_id, timeout=60)
    assert done.state == pb.CHECKOUT_STATE_FAILED and done.failure_reason == "pay-deadline-passed", done
    await nothing_charged(shop, checkout_id, charges)
    await wait_for(lambda: _released(shop, done.hold_id), timeout=30, message="the hold released")
    # The slot is free again: the next buyer gets it in one call.
    bought = await shop.api().CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_ok"),
                                             metadata=md(f"next-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())), timeout=10)
    assert bought.state == pb.CHECKOUT_STATE_COMPLETED, bought
