"""The invariant auditor's digest of booking (booking/digest.py): the holds created in a window
that were confirmed (bookings, and those cancelled after purchase) with what confirmed them, paged;
for the orchestrator (payments, `system`) alone, with a bounded window."""
from datetime import datetime, timedelta, timezone

import grpc
import pytest

from booking_harness import tomorrow
from cuty.booking.v1 import booking_pb2 as pb, booking_pb2_grpc
from cutylib.grpc_errors import bad_field
from cutylib.testing.trust import channel_as
from cutylib.timestamps import to_timestamp


def window(a: datetime, b: datetime, **kw) -> pb.DigestHoldsRequest:
    return pb.DigestHoldsRequest(start_time=to_timestamp(a), end_time=to_timestamp(b), **kw)


async def test_confirmed_holds_of_a_window_in_pages(booking):
    t0 = datetime.now(timezone.utc) - timedelta(seconds=1)
    salon, (r1,) = await booking.salon()
    slots = (await booking.day(salon, [r1], tomorrow(9), count=5))[r1]
    holds = [await booking.hold(s.id) for s in slots]
    for i, h in enumerate(holds[:3]):
        await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=h.id, payment_ref=f"pay-{i}"))
    await booking.stub.CancelBooking(pb.CancelBookingRequest(hold_id=holds[2].id, payment_ref="pay-2"))
    await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=holds[3].id))  # never confirmed: not listed
    t1 = datetime.now(timezone.utc) + timedelta(seconds=1)
    seen, token, pages = [], "", 0
    while True:
        answer = await booking.stub.DigestHolds(window(t0, t1, page_size=1, page_token=token))
        seen += answer.holds
        pages += 1
        token = answer.next_page_token
        if not token:
            break
    mine = {h.hold_id: h for h in seen if h.hold_id in {x.id for x in holds}}
    assert set(mine) == {h.id for h in holds[:3]} and pages >= 3
    assert [(mine[h.id].status, mine[h.id].payment_ref, mine[h.id].cancelled) for h in holds[:3]] == [
        (pb.HOLD_STATUS_CONFIRMED, "pay-0", False), (pb.HOLD_STATUS_CONFIRMED, "pay-1", False),
        (pb.HOLD_STATUS_RELEASED, "pay-2", True)]
    assert all(mine[h.id].price.amount_minor == h.price.amount_minor for h in holds[:3])
    times = [h.create_time.ToDatetime() for h in seen]
    assert times == sorted(times)


async def test_the_digest_is_the_orchestrators_and_its_window_bounded(booking):
    now = datetime.now(timezone.utc)
    addr = f"127.0.0.1:{booking.server.port}"
    ask = window(now - timedelta(hours=1), now)
    async with channel_as("payments", addr, "booking") as orchestrator, channel_as("gateway", addr, "booking") as gw:
        ours = booking_pb2_grpc.BookingServiceStub(orchestrator)
        await ours.DigestHolds(ask)
        refused = [
            (booking_pb2_grpc.BookingServiceStub(gw).DigestHolds(ask), grpc.StatusCode.PERMISSION_DENIED, ""),
            (ours.DigestHolds(pb.DigestHoldsRequest(start_time=to_timestamp(now))),
             grpc.StatusCode.INVALID_ARGUMENT, "end_time"),
            (ours.DigestHolds(window(now, now)), grpc.StatusCode.INVALID_ARGUMENT, "end_time"),
            (ours.DigestHolds(window(now - timedelta(days=1, seconds=1), now)), grpc.StatusCode.INVALID_ARGUMENT,
             "end_time"),
            (ours.DigestHolds(window(now - timedelta(hours=1), now, page_size=-1)), grpc.StatusCode.INVALID_ARGUMENT,
             "page_size"),
        ]
        for call, code, field in refused:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == code, (code, field)
            if field:
                assert bad_field(e.value) == field
