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


EVERY_DAY = tuple(range(1, 8))


@dataclasses.dataclass
class ServiceSalon:
    """A salon with services and working hours (docs/booking.md, "Services and working hours")."""
    salon_id: str
    resource_ids: list[str]
    service: pb.Service


async def service_salon(b: Booking, *, time_zone: str = "Europe/Berlin", resources: int = 2, duration: int = 60,
                        buffer_before: int = 0, buffer_after: int = 0, opens: str = "09:00", closes: str = "17:00",
                        days=EVERY_DAY, notice: int = 0, horizon: int = 730, step: int = 15,
                        price: int = 40000) -> ServiceSalon:
    salon_id, rs = await b.salon(time_zone=time_zone, resources=resources)
    await b.stub.SetBookingSettings(pb.SetBookingSettingsRequest(
        salon_id=salon_id, min_notice_minutes=notice, booking_horizon_days=horizon, time_step_minutes=step),
        metadata=ADMIN)
    for r in rs:
        await b.stub.SetWorkingHours(pb.SetWorkingHoursRequest(salon_id=salon_id, resource_id=r, intervals=[
            pb.WeeklyInterval(weekday=d, opens=opens, closes=closes) for d in days]), metadata=ADMIN)
    service = await b.stub.CreateService(pb.CreateServiceRequest(
        salon_id=salon_id, name="Cut", duration_minutes=duration, buffer_before_minutes=buffer_before,
        buffer_after_minutes=buffer_after, price=common_pb2.Money(currency_code="EUR", amount_minor=price),
        resource_ids=rs), metadata=ADMIN)
    return ServiceSalon(salon_id, rs, service)


async def availability(b: Booking, s: ServiceSalon, start_day: str, end_day: str = "",
                       resource_id: str = "", page_size: int = 0) -> list[pb.AvailableTime]:
    """Every page of the free times."""
    out, token = [], ""
    for _ in range(100):
        page = await b.stub.GetAvailability(pb.GetAvailabilityRequest(
            salon_id=s.salon_id, service_id=s.service.id, start_day=start_day, end_day=end_day,
            resource_id=resource_id, page_size=page_size, page_token=token), metadata=ADMIN)
        out += list(page.times)
        token = page.next_page_token
        if not token:
            return out
    raise AssertionError("availability did not end within 100 pages")


async def service_slot(b: Booking, s: ServiceSalon, start: datetime, resource_id: str = "") -> pb.Slot:
    return await b.stub.GetServiceSlot(pb.GetServiceSlotRequest(service_id=s.service.id, start_time=at(start),
                                                                resource_id=resource_id))


def local_times(times) -> list[str]:
    return [t.local_start_time for t in times]
