"""A salon's cancellation policy (CreateSalon, checked field by field, defaults 24 h
and 0 %), copied onto each hold when it is taken (the policy shown at purchase is the one applied,
whatever the salon says later), and CancelBooking: a confirmed booking released so its time is
bookable again, idempotent, the saga's only."""
import grpc
import pytest

from booking_harness import ADMIN, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.testing.ids import new_id
from cutylib.testing.trust import user


async def _salon(booking, **policy) -> tuple[pb.Salon, str]:
    salon = await booking.stub.CreateSalon(pb.CreateSalonRequest(name="Salon " + new_id()[:8],
                                                                 time_zone="Europe/Berlin", **policy), metadata=ADMIN)
    chair = await booking.stub.CreateResource(pb.CreateResourceRequest(salon_id=salon.id, name="chair"),
                                              metadata=ADMIN)
    return salon, chair.id


async def test_a_salon_answers_its_policy_and_the_defaults(booking):
    salon, _ = await _salon(booking, free_cancellation_hours=48, cancellation_fee_percent=35)
    assert (salon.free_cancellation_hours, salon.cancellation_fee_percent) == (48, 35)
    plain, _ = await _salon(booking)
    assert (plain.free_cancellation_hours, plain.cancellation_fee_percent) == (24, 0)
    free, _ = await _salon(booking, free_cancellation_hours=0, cancellation_fee_percent=100)
    assert (free.free_cancellation_hours, free.cancellation_fee_percent) == (0, 100)


@pytest.mark.parametrize("policy,field", [
    (dict(free_cancellation_hours=-1), "free_cancellation_hours"),
    (dict(free_cancellation_hours=8761), "free_cancellation_hours"),
    (dict(cancellation_fee_percent=-1), "cancellation_fee_percent"),
    (dict(cancellation_fee_percent=101), "cancellation_fee_percent"),
])
async def test_a_bad_policy_is_refused_naming_the_field(booking, policy, field):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _salon(booking, **policy)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == field


def _policy(salon_id: str, **policy) -> pb.SetCancellationPolicyRequest:
    return pb.SetCancellationPolicyRequest(salon_id=salon_id, **policy)


async def test_the_hold_carries_the_policy_of_when_it_was_taken(booking):
    salon, chair = await _salon(booking, free_cancellation_hours=12, cancellation_fee_percent=40)
    start = tomorrow(9)
    slot, later, booked_slot = await booking.slots(salon.id, [(chair, start, start.replace(hour=10)),
                                                              (chair, start.replace(hour=10), start.replace(hour=11)),
                                                              (chair, start.replace(hour=11), start.replace(hour=12))])
    hold = await booking.hold(slot.id)
    bought = await booking.hold(booked_slot.id)
    await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=bought.id, payment_ref="pay-" + new_id()))
    assert (hold.free_cancellation_hours, hold.cancellation_fee_percent) == (12, 40)
    # The salon's admin changes its policy: the salon answers the new one ...
    changed = await booking.stub.SetCancellationPolicy(_policy(salon.id, free_cancellation_hours=1,
                                                               cancellation_fee_percent=90), metadata=ADMIN)
    assert (changed.id, changed.free_cancellation_hours, changed.cancellation_fee_percent) == (salon.id, 1, 90)
    # ... a held and a bought booking keep theirs ...
    for h in (hold, bought):
        again = await booking.stub.GetHold(pb.GetHoldRequest(hold_id=h.id))
        assert (again.free_cancellation_hours, again.cancellation_fee_percent) == (12, 40)
    # ... and a hold taken from now on carries the new one.
    fresh = await booking.hold(later.id)
    assert (fresh.free_cancellation_hours, fresh.cancellation_fee_percent) == (1, 90)


async def test_a_policy_change_keeps_what_is_left_out(booking):
    salon, _ = await _salon(booking, free_cancellation_hours=48, cancellation_fee_percent=35)
    only_fee = await booking.stub.SetCancellationPolicy(_policy(salon.id, cancellation_fee_percent=0), metadata=ADMIN)
    assert (only_fee.free_cancellation_hours, only_fee.cancellation_fee_percent) == (48, 0)
    only_hours = await booking.stub.SetCancellationPolicy(_policy(salon.id, free_cancellation_hours=0), metadata=ADMIN)
    assert (only_hours.free_cancellation_hours, only_hours.cancellation_fee_percent) == (0, 0)
    assert (only_hours.name, only_hours.time_zone, only_hours.merchant_id) == (salon.name, salon.time_zone,
                                                                              salon.merchant_id)


@pytest.mark.parametrize("policy,field", [
    (dict(free_cancellation_hours=-1), "free_cancellation_hours"),
    (dict(free_cancellation_hours=8761, cancellation_fee_percent=10), "free_cancellation_hours"),
    (dict(cancellation_fee_percent=101), "cancellation_fee_percent"),
    (dict(free_cancellation_hours=2, cancellation_fee_percent=-5), "cancellation_fee_percent"),
    (dict(), "free_cancellation_hours"),  # neither: nothing to change
])
async def test_a_bad_policy_change_is_refused_naming_the_field_and_changes_nothing(booking, policy, field):
    salon, _ = await _salon(booking, free_cancellation_hours=6, cancellation_fee_percent=20)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.SetCancellationPolicy(_policy(salon.id, **policy), metadata=ADMIN)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == field
    same = await booking.stub.SetCancellationPolicy(_policy(salon.id, free_cancellation_hours=6), metadata=ADMIN)
    assert (same.free_cancellation_hours, same.cancellation_fee_percent) == (6, 20)


async def test_only_the_salons_merchants_admin_changes_its_policy(booking):
    salon, _ = await _salon(booking, free_cancellation_hours=6, cancellation_fee_percent=20)
    change = _policy(salon.id, cancellation_fee_percent=100)
    other_admin = user(new_id(), "admin", "merchant-other-" + new_id()[:6])
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.SetCancellationPolicy(change, metadata=other_admin)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # another merchant's salon does not exist for them
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.SetCancellationPolicy(_policy(new_id(), cancellation_fee_percent=1), metadata=ADMIN)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    for who in (user(new_id(), "staff"), user(new_id(), "customer"), user(new_id(), "operator")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await booking.stub.SetCancellationPolicy(change, metadata=who)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.SetCancellationPolicy(_policy("not-a-uuid", cancellation_fee_percent=1), metadata=ADMIN)
    assert bad_field(e.value) == "salon_id"
    unchanged = await booking.stub.SetCancellationPolicy(_policy(salon.id, free_cancellation_hours=6), metadata=ADMIN)
    assert unchanged.cancellation_fee_percent == 20


async def test_cancel_booking_frees_the_time_and_is_idempotent(booking):
    salon, chair = await _salon(booking)
    start = tomorrow(11)
    (slot,) = await booking.slots(salon.id, [(chair, start, start.replace(hour=12))])
    hold = await booking.hold(slot.id)
    await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay-1"))
    # Another payment's cancel, or a hold not confirmed, is refused.
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.CancelBooking(pb.CancelBookingRequest(hold_id=hold.id, payment_ref="pay-2"))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(e.value) == "hold-confirmed-by-other-payment"
    first = await booking.stub.CancelBooking(pb.CancelBookingRequest(hold_id=hold.id, payment_ref="pay-1"))
    again = await booking.stub.CancelBooking(pb.CancelBookingRequest(hold_id=hold.id, payment_ref="pay-1"))
    assert first.status == again.status == pb.HOLD_STATUS_RELEASED
    # Bookable again: someone else holds the same time.
    other = await booking.hold(slot.id)
    assert other.status == pb.HOLD_STATUS_HELD
    # A live hold is not a booking: CancelBooking refuses it (ReleaseHold is for that).
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.CancelBooking(pb.CancelBookingRequest(hold_id=other.id, payment_ref="pay-1"))
    assert error_reason(e.value) == "hold-held"


async def test_cancel_booking_is_the_sagas_only(booking):
    salon, chair = await _salon(booking)
    start = tomorrow(13)
    (slot,) = await booking.slots(salon.id, [(chair, start, start.replace(hour=14))])
    hold = await booking.hold(slot.id)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.CancelBooking(pb.CancelBookingRequest(hold_id=hold.id, payment_ref="x"),
                                         metadata=user(new_id(), "admin"))
    assert e.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)


async def test_the_no_show_fee_is_named_on_the_salons_slots(booking):
    """The salon's no-show fee (a percentage, default none) is named on each of its slots as money,
    rounded down; a change applies to every slot read from then on, and a bad one is refused."""
    salon, chair = await _salon(booking, no_show_fee_percent=33)
    assert salon.no_show_fee_percent == 33
    start = tomorrow(9)
    slot, = await booking.slots(salon.id, [(chair, start, start.replace(hour=10))], price=50001)
    got = await booking.stub.GetSlot(pb.GetSlotRequest(slot_id=slot.id))
    price = got.price.amount_minor
    assert (got.no_show_fee.currency_code, got.no_show_fee.amount_minor) == (got.price.currency_code, price * 33 // 100)
    listed = await booking.stub.ListSlots(pb.ListSlotsRequest(salon_id=salon.id, start_time=slot.start_time,
                                                              end_time=slot.end_time), metadata=ADMIN)
    assert [s.no_show_fee.amount_minor for s in listed.slots] == [price * 33 // 100]
    off = await booking.stub.SetCancellationPolicy(_policy(salon.id, no_show_fee_percent=0), metadata=ADMIN)
    assert (off.no_show_fee_percent, off.free_cancellation_hours) == (0, salon.free_cancellation_hours)
    assert not (await booking.stub.GetSlot(pb.GetSlotRequest(slot_id=slot.id))).HasField("no_show_fee")
    plain, _ = await _salon(booking)
    assert plain.no_show_fee_percent == 0
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.SetCancellationPolicy(_policy(salon.id, no_show_fee_percent=101), metadata=ADMIN)
    assert (e.value.code(), bad_field(e.value)) == (grpc.StatusCode.INVALID_ARGUMENT, "no_show_fee_percent")
