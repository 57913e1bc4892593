"""Retries are safe (every step of the saga may be repeated), and a hold moves only the ways it may."""
import asyncio
from datetime import timedelta

import grpc
import pytest

from booking_harness import tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.principal import Principal
from cutylib.testing.trust import user_of
from cutylib.testing.ids import new_id


async def _slots(b, n=2):
    salon, (r1,) = await b.salon()
    return (await b.day(salon, [r1], tomorrow(9), count=n))[r1]


def _code(exc_info) -> grpc.StatusCode:
    return exc_info.value.code()


async def test_hold_slot_retry_returns_the_same_hold_even_after_confirm(booking, booking_pool):
    (slot, _) = await _slots(booking)
    customer, request = new_id(), new_id()
    first = await booking.hold(slot.id, customer, request)
    again = await booking.hold(slot.id, customer, request)
    assert again == first

    await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=first.id, payment_ref="pay_a"))
    after = await booking.hold(slot.id, customer, request)
    assert (after.id, after.status, after.payment_ref) == (first.id, pb.HOLD_STATUS_CONFIRMED, "pay_a")
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE customer_id = $1", customer) == 1


async def test_concurrent_retries_make_one_hold(booking, booking_pool):
    slots = await _slots(booking)
    customer, request = new_id(), new_id()
    results = await asyncio.gather(*(booking.hold(slots[0].id, customer, request) for _ in range(20)))
    assert len({h.id for h in results}) == 1
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE customer_id = $1", customer) == 1


async def test_request_id_reused_for_another_slot_is_refused(booking, booking_pool):
    a, b = await _slots(booking)
    customer, request = new_id(), new_id()
    await booking.hold(a.id, customer, request)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.hold(b.id, customer, request)
    assert (_code(e), bad_field(e.value), error_reason(e.value)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "request_id", "request-id-reused")
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE slot_id = $1", b.id) == 0


async def test_confirm_is_idempotent_and_keeps_its_payment(booking):
    (slot, _) = await _slots(booking)
    hold = await booking.hold(slot.id)
    ok = [await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay_x")) for _ in range(2)]
    assert ok[0] == ok[1] and ok[0].status == pb.HOLD_STATUS_CONFIRMED
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay_other"))
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as e:  # a booking is not released
        await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=hold.id))
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION


async def test_release_is_idempotent_and_frees_the_time(booking):
    (slot, _) = await _slots(booking)
    hold = await booking.hold(slot.id)
    for _ in range(2):
        released = await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=hold.id))
        assert released.status == pb.HOLD_STATUS_RELEASED
    assert (await booking.hold(slot.id)).status == pb.HOLD_STATUS_HELD  # someone else gets it
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay_late"))
    assert (_code(e), error_reason(e.value)) == (grpc.StatusCode.FAILED_PRECONDITION, "hold-released")


async def test_extend_happens_once_and_retries_answer_the_same(booking):
    (slot, _) = await _slots(booking)
    hold = await booking.hold(slot.id)
    extended = await booking.stub.ExtendHold(pb.ExtendHoldRequest(hold_id=hold.id, seconds=120))
    assert extended.extended
    grew = extended.expire_time.ToDatetime() - hold.expire_time.ToDatetime()
    assert grew == timedelta(seconds=120)
    again = await booking.stub.ExtendHold(pb.ExtendHoldRequest(hold_id=hold.id, seconds=120))
    assert again.expire_time == extended.expire_time

    (other, _) = await _slots(booking)
    h2 = await booking.hold(other.id)
    full = await booking.stub.ExtendHold(pb.ExtendHoldRequest(hold_id=h2.id, seconds=0))  # 0 = the maximum
    assert full.expire_time.ToDatetime() - h2.expire_time.ToDatetime() == timedelta(
        seconds=booking.settings.hold_max_extension_seconds)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.ExtendHold(pb.ExtendHoldRequest(
            hold_id=h2.id, seconds=booking.settings.hold_max_extension_seconds + 1))
    assert (_code(e), bad_field(e.value)) == (grpc.StatusCode.INVALID_ARGUMENT, "seconds")


async def test_a_started_slot_cannot_be_held(booking, booking_pool):
    salon, (r1,) = await booking.salon()
    slot_id = new_id()
    # The API refuses to create past slots, so this one is written directly.
    await booking_pool.execute(
        "INSERT INTO slots (id, merchant_id, salon_id, resource_id, start_time, end_time, price_minor, currency) "
        "SELECT $1, r.merchant_id, r.salon_id, r.id, clock_timestamp() - interval '10 minutes', "
        "       clock_timestamp() + interval '20 minutes', 1, 'TRY' FROM resources r WHERE r.id = $2",
        slot_id, r1)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.hold(slot_id)
    assert (_code(e), error_reason(e.value)) == (grpc.StatusCode.FAILED_PRECONDITION, "slot-started")


async def test_no_customer_holds_reads_releases_or_confirms_by_itself(booking):
    """Holds are the orchestrator's alone (as `system`, naming the customer): only the gateway
    brings users, and it has no route to them, so a customer's own call is refused, even on its own
    hold (it could otherwise confirm with a made-up payment)."""
    (slot, other) = await _slots(booking)
    alice, bob = Principal(new_id(), "customer"), Principal(new_id(), "customer")
    hold = await booking.hold(slot.id, alice.subject)
    for md in (user_of(bob), user_of(alice)):
        for call in (booking.stub.HoldSlot(pb.HoldSlotRequest(slot_id=other.id, request_id="r2"), metadata=md),
                     booking.stub.GetHold(pb.GetHoldRequest(hold_id=hold.id), metadata=md),
                     booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=hold.id), metadata=md),
                     booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="free"), metadata=md)):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert _code(e) == grpc.StatusCode.PERMISSION_DENIED
    assert (await booking.stub.GetHold(pb.GetHoldRequest(hold_id=hold.id))).status == pb.HOLD_STATUS_HELD
