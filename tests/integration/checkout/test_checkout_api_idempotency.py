"""CheckoutService over real gRPC (in process): principal, status codes, Idempotency-Key replays."""
from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cuty.payments.v1 import checkout_pb2 as pb, checkout_pb2_grpc
from cutylib.grpc_errors import bad_field, error_reason, unpack_detail
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import user


def md(customer: str | None = None, key: str | None = None, role: str = "customer"):
    out = []
    if customer:
        out += list(user(customer, role))
    if key:
        out.append(("idempotency-key", key))
    return tuple(out)


@pytest.fixture
async def api(harness):
    channel = await harness.serve()
    return checkout_pb2_grpc.CheckoutServiceStub(channel)


async def call_raw(harness, method: str, request, metadata) -> bytes:
    """The serialized response bytes exactly as they came over the wire."""
    fn = harness.channel.unary_unary(f"/cuty.payments.v1.CheckoutService/{method}",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=lambda b: b)
    return await fn(request, metadata=metadata)


async def test_replay_returns_the_first_answer_byte_for_byte_and_has_no_second_effect(harness, api):
    cust, key = f"c-{uuid.uuid4()}", str(uuid.uuid4())
    req = pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot())
    first = await call_raw(harness, "CreateCheckout", req, md(cust, key))
    again = await call_raw(harness, "CreateCheckout", req, md(cust, key))
    assert first == again
    assert harness.booking.effects["hold"] == 1 and harness.booking.calls["HoldSlot"] == 1
    checkout = pb.Checkout.FromString(first)
    pay = pb.PayCheckoutRequest(checkout_id=checkout.id, payment_method="pm_card_ok")
    p1 = await call_raw(harness, "PayCheckout", pay, md(cust, "pay-" + key))
    p2 = await call_raw(harness, "PayCheckout", pay, md(cust, "pay-" + key))
    assert p1 == p2 and pb.Checkout.FromString(p1).state == pb.CHECKOUT_STATE_COMPLETED
    assert list(harness.psp.charges.values()) == [1]
    # The same key belongs to the customer: another customer's identical key is theirs alone.
    other = pb.Checkout.FromString(await call_raw(
        harness, "CreateCheckout", pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), md("c2", key)))
    assert other.id != checkout.id


@pytest.mark.parametrize("flow", ["pay", "one-call create"])
async def test_a_replayed_pay_shows_the_action_only_while_the_payment_requires_it(harness, api, flow):
    """Invariant 6: the stored answer keeps no client secret or redirect URL; a
    replay while 3-D Secure is pending shows the action of the payment as it is now, a replay after
    the payment finished shows none. The same for PayCheckout and a one-call CreateCheckout."""
    harness.start_workers(1)
    cust, key = f"c-{uuid.uuid4()}", "pay-" + str(uuid.uuid4())
    slot = harness.booking.add_slot()
    if flow == "pay":
        created = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot), metadata=md(cust))
        call, operation = api.PayCheckout, "pay"
        pay = pb.PayCheckoutRequest(checkout_id=created.id, payment_method="pm_card_3ds")
    else:
        call, operation = api.CreateCheckout, "create"
        pay = pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_3ds")
    first = await call(pay, metadata=md(cust, key))
    secret, redirect = first.payment.client_secret, first.payment.next_action.redirect_url
    assert first.state == pb.CHECKOUT_STATE_AWAITING_ACTION and secret and redirect
    stored = await harness.pool.fetchval("SELECT response FROM checkout_idempotency_keys WHERE customer_id = $1 "
                                         "AND operation = $2 AND key = $3", cust, operation, key)
    assert secret.encode() not in bytes(stored) and redirect.encode() not in bytes(stored)
    pending = await call(pay, metadata=md(cust, key))
    assert (pending.payment.client_secret, pending.payment.next_action.redirect_url) == (secret, redirect)

    pi = (await harness.core.get(first.payment.id)).psp_intent_id
    await harness.core.finalize(first.payment.id, "succeeded", "webhook", intent=harness.psp.set_status(pi))
    await wait_for(lambda: _row_state_is(harness, first.id, "COMPLETED"), timeout=5, message="COMPLETED")
    late = await call(pay, metadata=md(cust, key))
    assert late.id == first.id and late.payment.id == first.payment.id  # still the first answer ...
    assert not late.payment.client_secret and not late.payment.HasField("next_action")  # ... without the action
    assert list(harness.psp.charges.values()) == [1]


async def _row_state_is(harness, checkout_id: str, state: str) -> bool:
    return (await harness.row(checkout_id))["state"] == state


async def test_same_key_different_request_is_refused(harness, api):
    cust, key = f"c-{uuid.uuid4()}", str(uuid.uuid4())
    await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), metadata=md(cust, key))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), metadata=md(cust, key))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(e.value) == "idempotency-key-reused"
    assert harness.booking.effects["hold"] == 1


async def test_same_key_while_the_first_runs_is_aborted(harness, api):
    cust, key = f"c-{uuid.uuid4()}", str(uuid.uuid4())
    req = pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot())
    harness.booking.delay["HoldSlot"] = 0.5
    first = asyncio.ensure_future(api.CreateCheckout(req, metadata=md(cust, key)))
    await wait_for(lambda: harness.pool.fetchval(
        "SELECT count(*) FROM checkout_idempotency_keys WHERE key = $1", key), timeout=5, message="key taken")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(req, metadata=md(cust, key))
    assert e.value.code() == grpc.StatusCode.ABORTED
    assert error_reason(e.value) == "idempotency-key-in-flight"
    assert (await first).state == pb.CHECKOUT_STATE_HELD
    assert harness.booking.calls["HoldSlot"] == 1


async def test_rejection_is_replayed_with_its_alternatives(harness, api):
    cust, key = f"c-{uuid.uuid4()}", str(uuid.uuid4())
    slot = harness.booking.add_slot()
    harness.booking.take(slot)
    errs = []
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot), metadata=md(cust, key))
        errs.append(e.value)
    for err in errs:
        assert err.code() == grpc.StatusCode.ALREADY_EXISTS
        assert error_reason(err) == "slot-unavailable"
        assert len(unpack_detail(err, booking_pb2.SlotUnavailable).alternatives) == 1
    assert harness.booking.calls["HoldSlot"] == 1  # the replay did not ask booking again


async def test_out_of_stock_status(harness, api):
    pid = harness.codepool.add_product(stock=1)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(pb.CreateCheckoutRequest(product_id=pid, quantity=2), metadata=md("c"))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(e.value) == "out-of-stock"
    assert unpack_detail(e.value, codepool_pb2.OutOfStock).available == 1


@pytest.mark.parametrize("request_,field", [
    (pb.CreateCheckoutRequest(), "slot_id"),
    (pb.CreateCheckoutRequest(slot_id="x"), "slot_id"),
    (pb.CreateCheckoutRequest(product_id=str(uuid.uuid4()), quantity=0), "quantity"),
    (pb.CreateCheckoutRequest(product_id=str(uuid.uuid4()), quantity=101), "quantity"),
    (pb.CreateCheckoutRequest(slot_id=str(uuid.uuid4()), product_id=str(uuid.uuid4()), quantity=1), "slot_id"),
])
async def test_bad_create_input_names_the_field_and_leaves_the_key_free(harness, api, request_, field):
    key = str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(request_, metadata=md("c", key))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == field
    assert await harness.pool.fetchval("SELECT count(*) FROM checkout_idempotency_keys WHERE key = $1", key) == 0


async def test_unknown_slot_is_not_found_and_changes_nothing(harness, api):
    key = str(uuid.uuid4())
    before = await harness.pool.fetchval("SELECT count(*) FROM checkouts")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=str(uuid.uuid4())), metadata=md("c", key))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert await harness.pool.fetchval("SELECT count(*) FROM checkouts") == before
    assert await harness.pool.fetchval("SELECT count(*) FROM checkout_idempotency_keys WHERE key = $1", key) == 0


async def test_unauthenticated_and_other_customers(harness, api):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    c = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), metadata=md("alice"))
    for call in (api.GetCheckout(pb.GetCheckoutRequest(checkout_id=c.id), metadata=md("mallory")),
                 api.PayCheckout(pb.PayCheckoutRequest(checkout_id=c.id, payment_method="pm_card_ok"),
                                 metadata=md("mallory")),
                 api.CancelCheckout(pb.CancelCheckoutRequest(checkout_id=c.id), metadata=md("mallory"))):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    staff = await api.GetCheckout(pb.GetCheckoutRequest(checkout_id=c.id), metadata=md("bob", role="staff"))
    assert staff.state == pb.CHECKOUT_STATE_HELD
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.PayCheckout(pb.PayCheckoutRequest(checkout_id=c.id, payment_method="pm_card_ok"))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_paying_a_non_held_checkout_is_failed_precondition(harness, api):
    c = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), metadata=md("al"))
    await api.CancelCheckout(pb.CancelCheckoutRequest(checkout_id=c.id), metadata=md("al"))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.PayCheckout(pb.PayCheckoutRequest(checkout_id=c.id, payment_method="pm_card_ok"), metadata=md("al"))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not harness.psp.charges


async def test_expired_key_may_be_used_afresh(make_harness):
    h = make_harness(idempotency_ttl_seconds=0.2)
    channel = await h.serve()
    api = checkout_pb2_grpc.CheckoutServiceStub(channel)
    key = str(uuid.uuid4())
    a = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=h.booking.add_slot()), metadata=md("c", key))
    expired = "SELECT expires_at < clock_timestamp() FROM checkout_idempotency_keys WHERE key = $1"
    await wait_for(lambda: h.pool.fetchval(expired, key), timeout=5, message="the key to expire")
    b = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=h.booking.add_slot()), metadata=md("c", key))
    assert a.id != b.id
    # A new use beside the dead one (which leaves with its day's partition, never row by row).
    assert await h.pool.fetchval("SELECT count(*) FROM checkout_idempotency_keys WHERE key = $1", key) == 2


async def test_a_retried_pay_whose_first_attempt_died_answers_the_saga_state(harness, api):
    """The first PayCheckout dies mid-step (here: cancelled while booking is slow); the client's
    retry with the same key resumes it: no error, no second charge, the saga finishes."""
    harness.start_workers(1)
    c = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), metadata=md("eve"))
    harness.booking.delay["ExtendHold"] = 0.3
    first = asyncio.ensure_future(api.PayCheckout(pb.PayCheckoutRequest(checkout_id=c.id, payment_method="pm_card_ok"),
                                                  metadata=md("eve", "pay-1")))
    await wait_for(lambda: harness.booking.calls["ExtendHold"], timeout=5, message="pay under way")
    first.cancel()  # the client gives up; the server-side request is cancelled mid-step
    harness.booking.delay["ExtendHold"] = 0
    again = await wait_for(lambda: _pay_or_none(api, c.id, "pay-1"), timeout=10, message="the retry answers")
    assert again.state in (pb.CHECKOUT_STATE_CHARGING, pb.CHECKOUT_STATE_CONFIRMING, pb.CHECKOUT_STATE_COMPLETED)
    await wait_for(lambda: _state_is(api, c.id, pb.CHECKOUT_STATE_COMPLETED), timeout=10, message="COMPLETED")
    assert list(harness.psp.charges.values()) == [1] and harness.booking.effects["confirm"] == 1


async def _pay_or_none(api, checkout_id, key):
    try:
        return await api.PayCheckout(pb.PayCheckoutRequest(checkout_id=checkout_id, payment_method="pm_card_ok"),
                                     metadata=md("eve", key))
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.ABORTED:  # still in flight: retry
            return None
        raise


async def _state_is(api, checkout_id, state):
    return (await api.GetCheckout(pb.GetCheckoutRequest(checkout_id=checkout_id), metadata=md("eve"))).state == state


async def test_the_stored_answer_is_the_answer_given(harness, api):
    """The synchronous create and pay store the answer they give (a FINISH after the drive, issue
    11); replays match it byte for byte."""
    cust, key = f"c-{uuid.uuid4()}", str(uuid.uuid4())
    for req in (pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()),
                pb.CreateCheckoutRequest(product_id=harness.codepool.add_product(stock=2), quantity=1)):
        key = str(uuid.uuid4())
        first = await call_raw(harness, "CreateCheckout", req, md(cust, key))
        assert first == await call_raw(harness, "CreateCheckout", req, md(cust, key))
        checkout = pb.Checkout.FromString(first)
        assert checkout.state == pb.CHECKOUT_STATE_HELD
        pay = pb.PayCheckoutRequest(checkout_id=checkout.id, payment_method="pm_card_ok")
        p1 = await call_raw(harness, "PayCheckout", pay, md(cust, "pay-" + key))
        assert p1 == await call_raw(harness, "PayCheckout", pay, md(cust, "pay-" + key))
        paid = pb.Checkout.FromString(p1)
        assert paid.state == pb.CHECKOUT_STATE_COMPLETED and paid.payment.id
        rows = await harness.pool.fetch(
            "SELECT operation, state, response FROM checkout_idempotency_keys WHERE customer_id = $1 AND key = ANY($2)",
            cust, [key, "pay-" + key])
        assert {(r["operation"], r["state"], bytes(r["response"])) for r in rows} == {
            ("create", "done", first), ("pay", "done", p1)}


async def test_only_an_operator_or_admin_may_retry_a_checkout(harness, api):
    """RetryCheckout is an operator's tool; for others it does not exist."""
    cust = f"c-{uuid.uuid4()}"
    created = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), metadata=md(cust))
    req = pb.RetryCheckoutRequest(checkout_id=created.id)
    for role in ("customer", "staff"):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await api.RetryCheckout(req, metadata=md(cust, role=role))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as e:  # a HELD checkout needs no operator
        await api.RetryCheckout(req, metadata=md("ops-1", role="admin"))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(e.value) == "checkout-not-needing-attention"


async def test_a_pay_out_of_time_before_its_charge_is_never_charged_unless_its_caller_retries(harness, api):
    """The paying request's deadline is recorded with the payment attempt: a worker carrying the saga
    on after it does not start the charge (the buyer left); a retry with the same Idempotency-Key
    brings the caller back, and its own time counts."""
    gone = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), metadata=md("eve"))
    back = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=harness.booking.add_slot()), metadata=md("eve"))
    harness.booking.delay["ExtendHold"] = 1.0  # the step before the charge outlasts the requests' time
    for c, key in ((gone, "pay-gone"), (back, "pay-back")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await api.PayCheckout(pb.PayCheckoutRequest(checkout_id=c.id, payment_method="pm_card_ok"),
                                  metadata=md("eve", key), timeout=0.4)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    harness.booking.delay["ExtendHold"] = 0
    again = await wait_for(lambda: _pay_or_none(api, back.id, "pay-back"), timeout=10, message="the retry answers")
    assert again.state == pb.CHECKOUT_STATE_CHARGING
    assert await harness.pool.fetchval("SELECT pay_deadline > clock_timestamp() + interval '5 seconds' "
                                       "FROM checkouts WHERE id = $1", uuid.UUID(back.id))
    harness.start_workers(1)
    await wait_for(lambda: _state_is(api, back.id, pb.CHECKOUT_STATE_COMPLETED), timeout=10, message="COMPLETED")
    await wait_for(lambda: _state_is(api, gone.id, pb.CHECKOUT_STATE_FAILED), timeout=10, message="FAILED")
    ended = await api.GetCheckout(pb.GetCheckoutRequest(checkout_id=gone.id), metadata=md("eve"))
    assert ended.failure_reason == "pay-deadline-passed" and not ended.payment.id
    assert list(harness.psp.charges.values()) == [1]  # the retried one only
    assert await harness.pool.fetchval("SELECT count(*) FROM payments WHERE checkout_id = $1", uuid.UUID(gone.id)) == 0
    assert harness.booking.effects["confirm"] == 1
