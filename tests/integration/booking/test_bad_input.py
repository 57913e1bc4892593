"""Bad input is INVALID_ARGUMENT naming the field, unknown ids NOT_FOUND; nothing is written."""
from datetime import datetime, timedelta, timezone

import grpc
import pytest

from booking_harness import ADMIN, at, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cuty.common.v1 import common_pb2
from cutylib.grpc_errors import bad_field
from cutylib.testing.trust import user
from cutylib.testing.ids import new_id

T = tomorrow(10)
H = timedelta(hours=1)


async def _fails(call, code: grpc.StatusCode, field: str | None = None) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    assert e.value.code() == code, e.value.details()
    if field is not None:
        assert bad_field(e.value) == field, e.value.details()


@pytest.mark.parametrize("name, time_zone, field", [
    ("", "Europe/Istanbul", "name"),
    ("   ", "Europe/Istanbul", "name"),
    ("x" * 201, "Europe/Istanbul", "name"),
    ("{name}", "", "time_zone"),
    ("{name}", "Mars/Olympus_Mons", "time_zone"),
    ("{name}", "+03", "time_zone"),             # a POSIX offset Postgres would read as UTC-3
    ("{name}", "europe/istanbul", "time_zone"),
    ("{name}", "localtime", "time_zone"),
])
async def test_create_salon_bad_input_writes_nothing(booking, booking_pool, name, time_zone, field):
    unique = "salon " + new_id()
    name = name.replace("{name}", unique)
    await _fails(booking.stub.CreateSalon(pb.CreateSalonRequest(name=name, time_zone=time_zone), metadata=ADMIN),
                 grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await booking_pool.fetchval("SELECT count(*) FROM salons WHERE name = $1", name) == 0


async def test_resource_bad_input_and_unknown_salon(booking, booking_pool):
    salon, _ = await booking.salon(resources=0)
    stub = booking.stub
    await _fails(stub.CreateResource(pb.CreateResourceRequest(salon_id="salon-1", name="a"), metadata=ADMIN),
                 grpc.StatusCode.INVALID_ARGUMENT, "salon_id")
    await _fails(stub.CreateResource(pb.CreateResourceRequest(salon_id=salon, name=" "), metadata=ADMIN),
                 grpc.StatusCode.INVALID_ARGUMENT, "name")
    await _fails(stub.CreateResource(pb.CreateResourceRequest(salon_id=new_id(), name="a"), metadata=ADMIN),
                 grpc.StatusCode.NOT_FOUND)
    assert await booking_pool.fetchval("SELECT count(*) FROM resources WHERE salon_id = $1", salon) == 0


def _slot(resource_id, start=T, end=T + H, currency="TRY", amount=100, price=True):
    s = pb.SlotInput(resource_id=resource_id)
    if start is not None:
        s.start_time.CopyFrom(at(start))
    if end is not None:
        s.end_time.CopyFrom(at(end))
    if price:
        s.price.CopyFrom(common_pb2.Money(currency_code=currency, amount_minor=amount))
    return s


PAST = datetime.now(timezone.utc) - timedelta(hours=2)
BAD_SLOTS = [
    (dict(resource_id="chair-1"), "slots[1].resource_id"),
    (dict(resource_id=""), "slots[1].resource_id"),
    (dict(start=None), "slots[1].start_time"),
    (dict(end=None), "slots[1].end_time"),
    (dict(end=T), "slots[1].end_time"),                       # end == start
    (dict(end=T - H), "slots[1].end_time"),                   # end before start
    (dict(start=PAST, end=PAST + H), "slots[1].start_time"),  # in the past
    (dict(amount=-1), "slots[1].price.amount_minor"),
    (dict(currency="XYZ"), "slots[1].price.currency_code"),
    (dict(currency="eur"), "slots[1].price.currency_code"),
    (dict(currency=""), "slots[1].price.currency_code"),
    (dict(price=False), "slots[1].price"),
    (dict(start=T + 5 * H, end=T + 6 * H, duplicate=True), "slots[1]"),
]


@pytest.mark.parametrize("bad, field", BAD_SLOTS, ids=[f for _, f in BAD_SLOTS])
async def test_batch_with_one_bad_slot_writes_nothing(booking, booking_pool, bad, field):
    salon, (r1,) = await booking.salon()
    duplicate = bad.pop("duplicate", False)
    rid = bad.pop("resource_id", r1)
    first = _slot(r1, start=T + 5 * H, end=T + 6 * H) if duplicate else _slot(r1)
    req = pb.BatchCreateSlotsRequest(salon_id=salon, slots=[first, _slot(rid, **bad)])
    await _fails(booking.stub.BatchCreateSlots(req, metadata=ADMIN), grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await booking_pool.fetchval("SELECT count(*) FROM slots WHERE salon_id = $1", salon) == 0


async def test_batch_refusals_beyond_the_fields(booking, booking_pool):
    salon, (r1,) = await booking.salon()
    other_salon, (foreign,) = await booking.salon()
    stub = booking.stub
    await _fails(stub.BatchCreateSlots(pb.BatchCreateSlotsRequest(salon_id=salon), metadata=ADMIN),
                 grpc.StatusCode.INVALID_ARGUMENT, "slots")
    await _fails(stub.BatchCreateSlots(pb.BatchCreateSlotsRequest(salon_id="x", slots=[_slot(r1)]), metadata=ADMIN),
                 grpc.StatusCode.INVALID_ARGUMENT, "salon_id")
    for unknown in (new_id(), foreign):  # no such resource / another salon's chair
        req = pb.BatchCreateSlotsRequest(salon_id=salon, slots=[_slot(r1), _slot(unknown, start=T + 2 * H, end=T + 3 * H)])
        await _fails(stub.BatchCreateSlots(req, metadata=ADMIN), grpc.StatusCode.NOT_FOUND, "slots[1].resource_id")
    await _fails(stub.BatchCreateSlots(pb.BatchCreateSlotsRequest(salon_id=new_id(), slots=[_slot(r1)]), metadata=ADMIN),
                 grpc.StatusCode.NOT_FOUND)
    assert await booking_pool.fetchval("SELECT count(*) FROM slots WHERE salon_id = ANY($1::uuid[])",
                                       [salon, other_salon]) == 0
    # the same slot twice across calls
    await stub.BatchCreateSlots(pb.BatchCreateSlotsRequest(salon_id=salon, slots=[_slot(r1)]), metadata=ADMIN)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.BatchCreateSlots(pb.BatchCreateSlotsRequest(
            salon_id=salon, slots=[_slot(r1, start=T + 3 * H, end=T + 4 * H), _slot(r1)]), metadata=ADMIN)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    # the constraint's text (key columns and values) stays in the log
    assert e.value.details() == "a slot with the same resource, start and end exists already"
    assert await booking_pool.fetchval("SELECT count(*) FROM slots WHERE salon_id = $1", salon) == 1


async def test_admin_calls_need_an_admin(booking):
    customer = user(new_id(), "customer")
    staff = user(new_id(), "staff")
    for md in (customer, staff):
        await _fails(booking.stub.CreateSalon(pb.CreateSalonRequest(name="n", time_zone="UTC"), metadata=md),
                     grpc.StatusCode.PERMISSION_DENIED)


async def test_list_and_get_slot_bad_input(booking):
    salon, _ = await booking.salon()
    stub = booking.stub
    ok = dict(salon_id=salon, start_time=at(T), end_time=at(T + H))
    cases = [
        (dict(ok, salon_id="nope"), "salon_id"),
        ({k: v for k, v in ok.items() if k != "start_time"}, "start_time"),
        ({k: v for k, v in ok.items() if k != "end_time"}, "end_time"),
        (dict(ok, end_time=at(T)), "end_time"),
        (dict(ok, end_time=at(T + timedelta(days=400))), "end_time"),
    ]
    for kwargs, field in cases:
        await _fails(stub.ListSlots(pb.ListSlotsRequest(**kwargs)), grpc.StatusCode.INVALID_ARGUMENT, field)
    await _fails(stub.ListSlots(pb.ListSlotsRequest(**dict(ok, salon_id=new_id()))), grpc.StatusCode.NOT_FOUND)
    assert list((await stub.ListSlots(pb.ListSlotsRequest(**ok))).slots) == []  # known salon, nothing in range
    await _fails(stub.GetSlot(pb.GetSlotRequest(slot_id="12")), grpc.StatusCode.INVALID_ARGUMENT, "slot_id")
    await _fails(stub.GetSlot(pb.GetSlotRequest(slot_id=new_id())), grpc.StatusCode.NOT_FOUND)


async def test_hold_calls_bad_input_and_unknown_ids(booking, booking_pool):
    salon, (r1,) = await booking.salon()
    (slot,) = (await booking.day(salon, [r1], T, count=1))[r1]
    stub = booking.stub
    me = new_id()
    cases = [
        (stub.HoldSlot(pb.HoldSlotRequest(slot_id="slot-1", customer_id=me, request_id="r")), "slot_id"),
        (stub.HoldSlot(pb.HoldSlotRequest(slot_id=slot.id, customer_id="", request_id="r")), "customer_id"),
        (stub.HoldSlot(pb.HoldSlotRequest(slot_id=slot.id, customer_id=me, request_id="")), "request_id"),
        (stub.HoldSlot(pb.HoldSlotRequest(slot_id=slot.id, customer_id=me, request_id="r" * 201)), "request_id"),
        (stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id="h", payment_ref="p")), "hold_id"),
        (stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=new_id(), payment_ref="")), "payment_ref"),
        (stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=new_id()[:-1])), "hold_id"),
        (stub.ExtendHold(pb.ExtendHoldRequest(hold_id="")), "hold_id"),
        (stub.ExtendHold(pb.ExtendHoldRequest(hold_id=new_id(), seconds=-5)), "seconds"),
        (stub.GetHold(pb.GetHoldRequest(hold_id="not-a-uuid")), "hold_id"),
    ]
    for call, field in cases:
        await _fails(call, grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE customer_id = $1", me) == 0

    unknown = new_id()
    for call in (stub.HoldSlot(pb.HoldSlotRequest(slot_id=unknown, customer_id=me, request_id="r")),
                 stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=unknown, payment_ref="p")),
                 stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=unknown)),
                 stub.ExtendHold(pb.ExtendHoldRequest(hold_id=unknown, seconds=10)),
                 stub.GetHold(pb.GetHoldRequest(hold_id=unknown))):
        await _fails(call, grpc.StatusCode.NOT_FOUND)
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE customer_id = $1", me) == 0
