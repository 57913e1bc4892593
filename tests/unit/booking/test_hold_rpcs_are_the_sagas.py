"""The hold RPCs have one caller, the orchestrator as `system` (grpc_api.SYSTEM_RPCS); no route
brings a user to them, so each handler refuses any other principal itself, before the service is
asked anything: the service keeps no customer or merchant path for holds."""
from __future__ import annotations

import uuid

import pytest

from booking import grpc_api
from cuty.booking.v1 import booking_pb2 as pb
from cutylib import principal
from cutylib.errors import PermissionDenied
from cutylib.principal import Principal

HOLD_ID = str(uuid.uuid4())
REQUESTS = {
    "HoldSlot": pb.HoldSlotRequest(slot_id=HOLD_ID, customer_id="c-1", request_id="r-1"),
    "ConfirmHold": pb.ConfirmHoldRequest(hold_id=HOLD_ID, payment_ref="pay-1"),
    "ReleaseHold": pb.ReleaseHoldRequest(hold_id=HOLD_ID),
    "ExtendHold": pb.ExtendHoldRequest(hold_id=HOLD_ID, seconds=60),
    "GetHold": pb.GetHoldRequest(hold_id=HOLD_ID),
    "CancelBooking": pb.CancelBookingRequest(hold_id=HOLD_ID, payment_ref="pay-1"),
}
USERS = [Principal("c-1", "customer"), Principal("s-1", "staff", "m-1"), Principal("a-1", "admin", "m-1"),
         Principal("o-1", "operator")]


class Untouchable:
    """A service that fails the test if a refused call reaches it."""

    def __getattr__(self, name):
        raise AssertionError(f"the service was asked for {name!r}")


def test_every_hold_rpc_is_system_only_in_the_caller_table():
    assert set(REQUESTS) <= grpc_api.SYSTEM_RPCS
    assert all(grpc_api.CALLERS[rpc] == {grpc_api.PAYMENTS} for rpc in REQUESTS)


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
@pytest.mark.parametrize("user", USERS, ids=lambda p: p.role)
async def test_a_user_is_refused_by_the_handler_itself(rpc, user):
    servicer = grpc_api.BookingApi(Untouchable(), Untouchable())
    with principal.acting_as(user), pytest.raises(PermissionDenied):
        await getattr(servicer, rpc)(REQUESTS[rpc], None)
