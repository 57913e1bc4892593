"""Crash safety of the no-show fee's charge, with real processes: the payments process SIGKILLs
itself after the no-show was recorded and the fee became due but before the PSP call
(CUTY_CRASH_AT=no_show_fee:before), and after the PSP charged but before the outcome was recorded
(no_show_fee:after); restarted, the fee worker (or the staff's repeated MarkNoShow) finishes it, and
the PSP's ledger shows each fee charged exactly once, for the accepted amount, off-session. A PSP
that does not answer leaves the fee due (the answer says so), and the worker charges it later."""
from __future__ import annotations

import uuid

import grpc
import pytest_asyncio

from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2 as pb

from checkout_e2e import STAFF, crash_at_each_point, md, name, persist, start_stack
from cutylib.testing.procs import wait_for

PRICE, PERCENT, FEE = 75000, 20, 15000


@pytest_asyncio.fixture(scope="module")
async def shop(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("no-show-fee-crash"))
    # The salon's policy: a fifth of the price when the customer does not come.
    await s.db["booking"].execute("UPDATE salons SET no_show_fee_percent = $1 WHERE id = $2", PERCENT,
                                  uuid.UUID(s.salon_id))
    yield s
    await s.close()


async def bought_and_started(shop, card: str = "pm_card_ok") -> str:
    """A booking paid with the fee accepted, whose start (as the checkout knows it) has passed."""
    customer = f"fee-{uuid.uuid4().hex[:8]}"
    (slot,) = await shop.new_slots(1, price=PRICE)
    c = await persist(lambda: shop.create(customer, slot=slot, key=str(uuid.uuid4())))
    key = str(uuid.uuid4())
    await persist(lambda: shop.api().PayCheckout(pb.PayCheckoutRequest(
        checkout_id=c.id, payment_method=card,
        accept_no_show_fee=common_pb2.Money(currency_code="TRY", amount_minor=FEE)), metadata=md(customer, key),
        timeout=10))
    done = await shop.until(c.id)
    assert name(done.state) == "COMPLETED" and done.no_show_fee.amount.amount_minor == FEE
    await shop.db["payments"].execute("UPDATE checkouts SET start_time = clock_timestamp() - interval '1 minute' "
                                      "WHERE id = $1", uuid.UUID(c.id))
    return c.id


async def mark_no_show(shop, checkout_id: str) -> pb.Checkout:
    return await shop.api().MarkNoShow(pb.MarkNoShowRequest(checkout_id=checkout_id), metadata=STAFF, timeout=10)


async def fee_of(shop, checkout_id: str) -> dict:
    row = await shop.db["payments"].fetchrow(
        "SELECT no_show_fee_status, no_show_fee_payment_id FROM checkouts WHERE id = $1", uuid.UUID(checkout_id))
    return dict(row)


async def until_decided(shop, checkout_id: str, timeout: float = 60) -> dict:
    await wait_for(lambda: _decided(shop, checkout_id), timeout=timeout, interval=0.2,
                   message=f"the no-show fee of {checkout_id} decided")
    return await fee_of(shop, checkout_id)


async def _decided(shop, checkout_id: str) -> bool:
    return (await fee_of(shop, checkout_id))["no_show_fee_status"] in ("charged", "declined")


async def fee_charges(shop, checkout_id: str) -> list[dict]:
    return [c for c in (await shop.ledger())["charges"] if c["idempotency_key"] == f"no-show-fee:{checkout_id}"]


async def test_a_crash_around_the_fee_charge_charges_it_once(shop):
    async def scenario(shop):
        cid = await bought_and_started(shop)
        try:
            await mark_no_show(shop, cid)
        except grpc.aio.AioRpcError as e:  # the process died under the call
            assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN), e
        return cid

    checkouts = await crash_at_each_point(shop, [("no_show_fee:before", scenario),
                                                 ("no_show_fee:after", scenario)])
    for cid in checkouts:
        fee = await until_decided(shop, cid)
        assert fee["no_show_fee_status"] == "charged", (cid, fee)
        # Marked again by the staff: the same no-show, nothing more charged.
        again = await persist(lambda: mark_no_show(shop, cid))
        assert again.no_show_fee.status == "charged" and again.no_show_fee.payment_id == str(fee["no_show_fee_payment_id"])
        charges = await fee_charges(shop, cid)
        assert [(c["amount"], c["off_session"]) for c in charges] == [(FEE, True)], (cid, charges)
        assert (await shop.ledger())["charge_count_by_key"][f"no-show-fee:{cid}"] == 1
        rows = await shop.db["payments"].fetch("SELECT amount_minor, status, off_session FROM payments "
                                               "WHERE checkout_id = $1 AND off_session = 'charge'", uuid.UUID(cid))
        assert [tuple(r) for r in rows] == [(FEE, "succeeded", "charge")]


async def test_a_psp_that_does_not_answer_leaves_the_fee_due_for_the_worker(shop):
    cid = await bought_and_started(shop)
    # Every off-session create answers 503 until the PSP recovers: outcome unknown, however often the
    # staff's call or the worker tries (a slow call retried by persist() must not find it recovered).
    await shop.psp_faults(fail_next_creates=1000)
    try:
        answer = await persist(lambda: mark_no_show(shop, cid))
        # Not known yet: due, and why (the fee's payment is created, its charge not answered).
        assert answer.no_show_fee.status == "due" and answer.no_show_fee.failure_reason
        assert (await fee_of(shop, cid))["no_show_fee_status"] == "due"
    finally:
        await shop.psp_faults(fail_next_creates=0)  # the PSP answers again
    fee = await until_decided(shop, cid)
    assert fee["no_show_fee_status"] == "charged"
    assert [c["amount"] for c in await fee_charges(shop, cid)] == [FEE]


async def test_a_declined_fee_is_declined_once_and_never_charged(shop):
    cid = await bought_and_started(shop, card="pm_card_off_session_declined")
    answer = await persist(lambda: mark_no_show(shop, cid))
    assert answer.no_show_fee.status == "declined" and answer.no_show_fee.failure_reason
    # Only a due fee is ever claimed: a declined one stays declined.
    assert (await fee_of(shop, cid))["no_show_fee_status"] == "declined"
    assert await fee_charges(shop, cid) == []
