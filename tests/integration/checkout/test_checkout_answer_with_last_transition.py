"""A request that ends its checkout (a one-call purchase, a PayCheckout that completes or fails)
stores its Idempotency-Key's answer with the transition that ends the saga, in the same statement:
no FINISH of its own after it (docs/payments.md, "Statements per checkout"). Its replay is the
answer byte for byte, and an answer that differed from what the transition stored is stored again
before the request answers."""
from __future__ import annotations

import uuid

import pytest

from cuty.payments.v1 import checkout_pb2 as pb
from payments.checkout import views, wiring
from payments.checkout.answers import CheckoutAnswer
from payments.checkout.domain import validate_create
from payments.checkout.idempotency import FINISH, RESTORE, Replay
from payments.checkout.repository import TRANSITION_FINISHING

from test_checkout_webhook_after_final import CountingPool


def counted(h) -> tuple[CountingPool, object]:
    """The checkout service of `h` over a pool that counts the saga's statements (the payments
    core's own are not counted here)."""
    pool = CountingPool(h.pool)
    service, _engine, _worker, _ = wiring.build(h.settings, pool, h.core, options=h.options,
                                                booking_stub=h.booking, codepool_stub=h.codepool)
    return pool, service


async def replayed(service, me: str, req, key: str) -> bytes:
    with pytest.raises(Replay) as replay:
        await service.create(me, req, key)
    return replay.value.response


async def stored_answer(h, customer: str, operation: str, key: str) -> tuple[str, bytes]:
    row = await h.pool.fetchrow("SELECT state, response FROM checkout_idempotency_keys "
                                "WHERE customer_id = $1 AND operation = $2 AND key = $3", customer, operation, key)
    return row["state"], bytes(row["response"])


async def test_a_one_call_purchase_stores_its_answer_with_its_last_transition(harness):
    h, me, key = harness, f"c-{uuid.uuid4()}", str(uuid.uuid4())
    pool, service = counted(h)
    done = await service.create(me, validate_create(h.booking.add_slot(), "", 0, "pm_card_ok"), key)
    assert done.saga.state == "COMPLETED"
    assert FINISH not in pool.asked  # no statement of its own for the answer
    assert pool.asked.count(TRANSITION_FINISHING) == 1 and pool.asked[-1] == TRANSITION_FINISHING
    assert await stored_answer(h, me, "create", key) == ("done", views.stored(done))
    # The replay is the answer, byte for byte.
    again = await replayed(service, me, validate_create(done.saga.slot_id, "", 0, "pm_card_ok"), key)
    assert again == views.checkout_pb(done).SerializeToString()


async def test_two_call_stores_the_pay_answer_with_its_last_transition(harness):
    h, me = harness, f"c-{uuid.uuid4()}"
    pool, service = counted(h)
    held = await service.create(me, validate_create(h.booking.add_slot(), "", 0), "hold-key")
    assert held.saga.state == "HELD"
    assert pool.asked.count(FINISH) == 1  # the saga waits (HELD): the request's own FINISH
    pool.asked.clear()
    paid = await service.pay(me, held.saga.id, "pm_card_ok", "pay-key")
    assert paid.saga.state == "COMPLETED"
    assert FINISH not in pool.asked and pool.asked[-1] == TRANSITION_FINISHING
    assert await stored_answer(h, me, "pay", "pay-key") == ("done", views.stored(paid))


async def test_a_declined_one_call_stores_its_failed_answer_with_its_last_transition(harness):
    h, me, key = harness, f"c-{uuid.uuid4()}", str(uuid.uuid4())
    pool, service = counted(h)
    failed = await service.create(me, validate_create(h.booking.add_slot(), "", 0, "pm_card_declined"), key)
    assert failed.saga.state == "FAILED" and failed.saga.failure_reason
    assert FINISH not in pool.asked and pool.asked[-1] == TRANSITION_FINISHING
    assert await stored_answer(h, me, "create", key) == ("done", views.stored(failed))


async def test_an_answer_that_differs_from_the_stored_one_is_stored_again(harness):
    """Should the row the transition wrote ever differ from the one the answer was built from, the
    request stores its own answer again before answering: a replay never gives another answer."""
    h, me, key = harness, f"c-{uuid.uuid4()}", str(uuid.uuid4())
    pool, service = counted(h)
    wrong = lambda claim: service.keys.finishing(  # noqa: E731 - an answer that is not the request's
        claim, lambda saga, payment: CheckoutAnswer(saga.__class__(**{**saga.__dict__, "slot_id": None}), payment))
    service._finishing = wrong
    done = await service.create(me, validate_create(h.booking.add_slot(), "", 0, "pm_card_ok"), key)
    assert done.saga.state == "COMPLETED" and pool.asked.count(TRANSITION_FINISHING) == 1
    assert pool.asked.count(RESTORE) == 1
    assert await stored_answer(h, me, "create", key) == ("done", views.stored(done))
    again = await replayed(service, me, validate_create(done.saga.slot_id, "", 0, "pm_card_ok"), key)
    assert pb.Checkout.FromString(again).slot_id == done.saga.slot_id
