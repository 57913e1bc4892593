"""ListSlots is paged (page_size <= 500, page_token), in a stable order, so no
request reads a salon's whole calendar at once; a bad token or size names its field."""
from datetime import timedelta

import grpc
import pytest

from booking_harness import at, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import bad_field


async def _all_pages(stub, req: pb.ListSlotsRequest) -> list[list[pb.Slot]]:
    pages, token = [], ""
    while True:
        page = pb.ListSlotsRequest()
        page.CopyFrom(req)
        page.page_token = token
        got = await stub.ListSlots(page)
        pages.append(list(got.slots))
        token = got.next_page_token
        if not token:
            return pages


async def test_pages_cover_every_slot_once_in_order(booking):
    salon, (r1, r2, r3) = await booking.salon(resources=3)
    start = tomorrow(6)
    made = await booking.day(salon, [r1, r2, r3], start, count=7, minutes=30)  # 21 slots, 3 per start time
    req = pb.ListSlotsRequest(salon_id=salon, start_time=at(start), end_time=at(start + timedelta(hours=12)),
                              page_size=4)
    pages = await _all_pages(booking.stub, req)
    assert [len(p) for p in pages] == [4, 4, 4, 4, 4, 1]
    listed = [s for p in pages for s in p]
    assert len({s.id for s in listed}) == 21 == len(listed)
    assert {s.id for s in listed} == {s.id for r in made for s in made[r]}
    keys = [(s.start_time.ToDatetime(), s.resource_id, s.id) for s in listed]
    assert keys == sorted(keys)
    # Without a page size the default page holds them all; an exact fit leaves no next page.
    whole = await booking.stub.ListSlots(pb.ListSlotsRequest(salon_id=salon, start_time=req.start_time,
                                                             end_time=req.end_time))
    assert [s.id for s in whole.slots] == [s.id for s in listed] and not whole.next_page_token
    exact = await booking.stub.ListSlots(pb.ListSlotsRequest(salon_id=salon, start_time=req.start_time,
                                                             end_time=req.end_time, page_size=21))
    assert len(exact.slots) == 21 and not exact.next_page_token


async def test_a_page_holds_at_most_500_and_a_larger_page_size_is_refused(booking):
    """The contract says page_size is 0..500 (booking.proto): 500 is a full page, more is refused
    naming page_size, as the OpenAPI document states, rather than quietly cut."""
    salon, (r1, r2) = await booking.salon(resources=2)
    start = tomorrow(0)
    await booking.day(salon, [r1, r2], start, count=260, minutes=5)  # 520 slots in under 22 hours
    window = dict(salon_id=salon, start_time=at(start), end_time=at(start + timedelta(days=1)))
    got = await booking.stub.ListSlots(pb.ListSlotsRequest(**window, page_size=500))
    assert len(got.slots) == 500 and got.next_page_token
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.ListSlots(pb.ListSlotsRequest(**window, page_size=501))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == "page_size"


@pytest.mark.parametrize("change,field", [
    (dict(page_token="not-a-token"), "page_token"),
    (dict(page_token="YmsxAAAA"), "page_token"),
    (dict(page_size=-1), "page_size"),
])
async def test_bad_page_arguments_name_their_field(booking, change, field):
    salon, _ = await booking.salon()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.ListSlots(pb.ListSlotsRequest(
            salon_id=salon, start_time=at(tomorrow(0)), end_time=at(tomorrow(23)), **change))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == field
