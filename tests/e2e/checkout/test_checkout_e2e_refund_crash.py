"""Crash safety with real processes: the payments process SIGKILLs itself between
the refund's database write and the PSP call (CUTY_CRASH_AT=psp_refund:before), then between the
PSP's answer and its record (psp_refund:after); restarted, the staff's retry with the same
Idempotency-Key (or reconciliation, whichever comes first) finishes the refund, and the PSP's
ledger shows the money went back exactly once."""
from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest_asyncio

from cuty.common.v1 import common_pb2
from cuty.payments.v1 import payments_pb2, payments_pb2_grpc

from checkout_e2e import STAFF, name, persist, start_stack

PROC = "payments-0"


@pytest_asyncio.fixture(scope="module")
async def refundable(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("refund-crash"))
    yield s
    await s.close()


async def crash_at(shop, point: str | None) -> None:
    env = shop.stack.procs[PROC].env
    if point is None:
        env.pop("CUTY_CRASH_AT", None)
    else:
        env["CUTY_CRASH_AT"] = point
    try:
        await shop.stack.restart(PROC)
    except RuntimeError:
        pass  # killed at `point` by reconciliation finishing the pending refund, before it was healthy


async def test_a_crash_around_the_psp_refund_call_refunds_once(refundable):
    shop = refundable
    customer = f"refund-crash-{uuid.uuid4().hex[:8]}"
    (slot,) = await shop.new_slots(1)
    c = await persist(lambda: shop.create(customer, slot=slot, key=str(uuid.uuid4())))
    await persist(lambda: shop.pay(customer, c.id, "pm_card_ok", key=str(uuid.uuid4())))
    done = await shop.until(c.id)
    assert name(done.state) == "COMPLETED"
    payment = done.payment.id
    intent = await shop.db["payments"].fetchval("SELECT psp_intent_id FROM payments WHERE id = $1",
                                                uuid.UUID(payment))
    key = str(uuid.uuid4())
    req = payments_pb2.IssueRefundRequest(payment_id=payment, reason="crash test",
                                          amount=common_pb2.Money(currency_code="TRY", amount_minor=30000))

    def stub():
        return payments_pb2_grpc.PaymentServiceStub(shop._channels[0])

    async def ask():
        return await stub().IssueRefund(req, metadata=STAFF + (("idempotency-key", key),), timeout=5)

    async def psp_refunds():
        return [r for r in (await shop.ledger())["refunds"] if r["intent_id"] == intent]

    for point, refunded_at_psp in (("psp_refund:before", 0), ("psp_refund:after", 1)):
        await crash_at(shop, point)
        proc = shop.stack.procs[PROC]

        async def until_crashed():
            # Not yet killed by reconciliation: the staff's call does it, retried with the same key
            # while the restarted process is not serving yet (UNAVAILABLE before it listens).
            while proc.proc.poll() is None:
                try:
                    await ask()
                except grpc.aio.AioRpcError as e:
                    assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e
                await asyncio.sleep(0.2)

        await asyncio.wait_for(until_crashed(), timeout=60)
        assert proc.proc.returncode == -9 and f'"crash_point": "{point}"' in proc.tail(20000)
        row = await shop.db["payments"].fetchrow("SELECT status, amount_minor FROM refunds WHERE payment_id = $1",
                                                 uuid.UUID(payment))
        assert (row["status"], row["amount_minor"]) == ("pending", 30000)
        assert len(await psp_refunds()) == refunded_at_psp, point

    await crash_at(shop, None)
    answer = await persist(ask, what="the refund, finished")
    assert answer.status == payments_pb2.REFUND_STATUS_SUCCEEDED
    assert answer.payment.status == payments_pb2.PAYMENT_STATUS_PARTIALLY_REFUNDED
    assert [r["amount"] for r in await psp_refunds()] == [30000]
    p = await shop.db["payments"].fetchrow("SELECT refunded_minor, refund_settled_minor FROM payments WHERE id = $1",
                                           uuid.UUID(payment))
    assert (p["refunded_minor"], p["refund_settled_minor"]) == (30000, 30000)
