"""Helpers of the booking integration tests: a client bound to an in-process server, catalog builders."""
from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

from cuty.booking.v1 import booking_pb2 as pb
from cuty.booking.v1 import booking_pb2_grpc
from cuty.common.v1 import common_pb2
from cutylib.config import Settings
from cutylib.testing.trust import user
from cutylib.testing.ids import new_id

ADMIN = user(new_id(), "admin")


def at(dt: datetime):
    from google.protobuf.timestamp_pb2 import Timestamp

    ts = Timestamp()
    ts.FromDatetime(dt)
    return ts


def tomorrow(hour: int = 9) -> datetime:
    d = datetime.now(timezone.utc) + timedelta(days=1)
    return d.replace(hour=hour, minute=0, second=0, microsecond=0)


@dataclasses.dataclass
class Booking:
    """A running booking server and a client for it."""
    server: object
    stub: booking_pb2_grpc.BookingServiceStub
    settings: Settings

    async def salon(self, time_zone: str = "Europe/Istanbul", resources: int = 1) -> tuple[str, list[str]]:
        salon = await self.stub.CreateSalon(pb.CreateSalonRequest(name="Salon " + new_id()[:8], time_zone=time_zone),
                                            metadata=ADMIN)
        rs = [await self.stub.CreateResource(pb.CreateResourceRequest(salon_id=salon.id, name=f"chair {i}"),
                                             metadata=ADMIN) for i in range(resources)]
        return salon.id, [r.id for r in rs]

    async def slots(self, salon_id: str, spans: list[tuple[str, datetime, datetime]], price: int = 50000,
                    currency: str = "TRY") -> list[pb.Slot]:
        req = pb.BatchCreateSlotsRequest(salon_id=salon_id, slots=[
            pb.SlotInput(resource_id=r, start_time=at(s), end_time=at(e),
                         price=common_pb2.Money(currency_code=currency, amount_minor=price))
            for r, s, e in spans])
        return list((await self.stub.BatchCreateSlots(req, metadata=ADMIN)).slots)

    async def day(self, salon_id: str, resource_ids: list[str], start: datetime, count: int,
                  minutes: int = 60) -> dict[str, list[pb.Slot]]:
        """`count` back-to-back slots of `minutes` per resource from `start`."""
        step = timedelta(minutes=minutes)
        made = await self.slots(salon_id, [(r, start + i * step, start + (i + 1) * step)
                                           for r in resource_ids for i in range(count)])
        return {r: [s for s in made if s.resource_id == r] for r in resource_ids}

    async def hold(self, slot_id: str, customer: str | None = None, request_id: str | None = None) -> pb.Hold:
        return await self.stub.HoldSlot(pb.HoldSlotRequest(
            slot_id=slot_id, customer_id=customer or new_id(), request_id=request_id or new_id()))


async def expired(pool, hold_id: str) -> bool:
    """True once the hold's expiry has passed on the database clock (its row may still say 'held')."""
    return await pool.fetchval("SELECT expires_at <= clock_timestamp() FROM holds WHERE id = $1", hold_id)
