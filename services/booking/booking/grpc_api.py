"""cuty.booking.v1.BookingService: proto <-> use case translation only.

Field checks call domain rules (they name the proto field at fault); errors are raised, and
cutylib's interceptor turns them into statuses with details.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import grpc

from cuty.booking.v1 import booking_pb2 as pb
from cuty.booking.v1 import booking_pb2_grpc
from cuty.common.v1 import common_pb2
from cutylib import principal, tenancy
from cutylib.errors import AlreadyExists, InvalidArgument
from cutylib.fields import parse_uuid
from cutylib.timestamps import optional_instant, to_timestamp, window
from cutylib.tls import GATEWAY, PAYMENTS

from . import digest, domain, schedule
from .domain import Hold, Salon, Slot
from .service import BookingService, ScheduleService, SlotTaken

# Which service may call each RPC (its certificate's identity); the server refuses the rest.
# The catalogue is the gateway's (admins and signed-in users); holds are the orchestrator's alone.
# Roles are checked here too (require_admin); which merchant's rows a user sees is the service's:
# staff and admins their own merchant's, customers and the operator (ListSlots) any.
CALLERS = {
    "CreateSalon": {GATEWAY}, "SetCancellationPolicy": {GATEWAY}, "CreateResource": {GATEWAY}, "BatchCreateSlots": {GATEWAY},
    "ListSlots": {GATEWAY}, "GetSlot": {PAYMENTS}, "ListBookings": {GATEWAY},
    "HoldSlot": {PAYMENTS}, "ConfirmHold": {PAYMENTS}, "ReleaseHold": {PAYMENTS}, "ExtendHold": {PAYMENTS},
    "GetHold": {PAYMENTS}, "CancelBooking": {PAYMENTS},
    "CreateService": {GATEWAY}, "ListServices": {GATEWAY}, "SetWorkingHours": {GATEWAY}, "SetHoursOverride": {GATEWAY},
    "SetBookingSettings": {GATEWAY}, "GetAvailability": {GATEWAY}, "GetServiceSlot": {PAYMENTS},
    "DigestHolds": {PAYMENTS}, "SummarizeHolds": {PAYMENTS},  # payments' invariant auditor
}
# Where a caller other than the gateway acts as `system` (cutylib.grpc_server.Trust): the saga's
# steps, called by the orchestrator in no user's name; nowhere else.
SYSTEM_RPCS = frozenset({"GetSlot", "GetServiceSlot", "HoldSlot", "ConfirmHold", "ReleaseHold", "ExtendHold",
                         "GetHold", "CancelBooking", "DigestHolds", "SummarizeHolds"})
# The user roles the gateway may bring to booking (those of its routes to booking, gateway/policy.py).
USER_ROLES = frozenset({"customer", "staff", "admin", "operator"})

_STATUS = {
    domain.HELD: pb.HOLD_STATUS_HELD,
    domain.CONFIRMED: pb.HOLD_STATUS_CONFIRMED,
    domain.RELEASED: pb.HOLD_STATUS_RELEASED,
    domain.EXPIRED: pb.HOLD_STATUS_EXPIRED,
}



def _id(value) -> str:
    return "" if value is None else str(value)


def slot_pb(s: Slot) -> pb.Slot:
    return pb.Slot(id=str(s.id), resource_id=_id(s.resource_id), salon_id=str(s.salon_id),
                   start_time=to_timestamp(s.start_time), end_time=to_timestamp(s.end_time), local_start_time=s.local_start_time,
                   price=common_pb2.Money(currency_code=s.currency, amount_minor=s.price_minor),
                   available=s.available, service_id=_id(s.service_id), merchant_id=s.merchant_id,
                   no_show_fee=common_pb2.Money(currency_code=s.currency, amount_minor=s.no_show_fee_minor)
                   if s.no_show_fee_minor else None)


def hold_pb(h: Hold) -> pb.Hold:
    return pb.Hold(id=str(h.id), slot_id=str(h.slot_id), resource_id=str(h.resource_id), customer_id=h.customer_id,
                   status=_STATUS[h.status], expire_time=to_timestamp(h.expires_at), start_time=to_timestamp(h.start_time),
                   end_time=to_timestamp(h.end_time), price=common_pb2.Money(currency_code=h.currency, amount_minor=h.price_minor),
                   payment_ref=h.payment_ref, extended=h.extended, create_time=to_timestamp(h.created_at),
                   request_id=h.request_id, merchant_id=h.merchant_id, salon_id=str(h.salon_id),
                   free_cancellation_hours=h.free_cancellation_hours,
                   cancellation_fee_percent=h.cancellation_fee_percent, service_id=_id(h.service_id),
                   buffer_before_minutes=h.buffer_before_minutes, buffer_after_minutes=h.buffer_after_minutes,
                   offered=h.offered)


def salon_pb(salon: Salon) -> pb.Salon:
    return pb.Salon(id=str(salon.id), name=salon.name, time_zone=salon.time_zone, merchant_id=salon.merchant_id,
                    free_cancellation_hours=salon.free_cancellation_hours,
                    cancellation_fee_percent=salon.cancellation_fee_percent,
                    min_notice_minutes=salon.min_notice_minutes, booking_horizon_days=salon.booking_horizon_days,
                    time_step_minutes=salon.time_step_minutes, no_show_fee_percent=salon.no_show_fee_percent)


def service_pb(s: schedule.Service) -> pb.Service:
    return pb.Service(id=str(s.id), salon_id=str(s.salon_id), name=s.name, duration_minutes=s.duration_minutes,
                      price=common_pb2.Money(currency_code=s.currency, amount_minor=s.price_minor),
                      buffer_before_minutes=s.buffer_before_minutes, buffer_after_minutes=s.buffer_after_minutes,
                      resource_ids=[str(r) for r in s.resource_ids])


def booking_pb(h: Hold, time_zone: str) -> pb.Booking:
    """One agenda entry."""
    return pb.Booking(hold_id=str(h.id), slot_id=str(h.slot_id), resource_id=str(h.resource_id),
                      start_time=to_timestamp(h.start_time), end_time=to_timestamp(h.end_time),
                      local_start_time=domain.local_time(h.start_time, time_zone), status=_STATUS[h.status],
                      customer_id=h.customer_id, payment_ref=h.payment_ref)


class BookingApi(booking_pb2_grpc.BookingServiceServicer):
    def __init__(self, service: BookingService, schedule_service: ScheduleService):
        self.service = service
        self.schedule = schedule_service

    # --- catalog ---------------------------------------------------------------------------------

    async def CreateSalon(self, request: pb.CreateSalonRequest, context: grpc.aio.ServicerContext) -> pb.Salon:
        caller = principal.current()
        domain.require_admin(caller)
        policy = domain.cancellation_policy(
            request.free_cancellation_hours if request.HasField("free_cancellation_hours") else None,
            request.cancellation_fee_percent if request.HasField("cancellation_fee_percent") else None,
            request.no_show_fee_percent if request.HasField("no_show_fee_percent") else None)
        salon = await self.service.create_salon(caller, domain.require_name("name", request.name),
                                                domain.require_time_zone("time_zone", request.time_zone), policy)
        return salon_pb(salon)

    async def SetCancellationPolicy(self, request: pb.SetCancellationPolicyRequest,
                                    context: grpc.aio.ServicerContext) -> pb.Salon:
        caller = principal.current()
        caller.require_role("admin")  # of the salon's merchant (the update filters by it)
        tenancy.owning_merchant(caller)
        salon_id = parse_uuid("salon_id", request.salon_id)
        hours, fee = domain.policy_change(
            request.free_cancellation_hours if request.HasField("free_cancellation_hours") else None,
            request.cancellation_fee_percent if request.HasField("cancellation_fee_percent") else None)
        no_show = request.no_show_fee_percent if request.HasField("no_show_fee_percent") else None
        return salon_pb(await self.service.set_cancellation_policy(caller, salon_id, hours, fee, no_show))

    async def CreateResource(self, request: pb.CreateResourceRequest,
                             context: grpc.aio.ServicerContext) -> pb.Resource:
        caller = principal.current()
        domain.require_admin(caller)
        resource = await self.service.create_resource(caller, parse_uuid("salon_id", request.salon_id),
                                                      domain.require_name("name", request.name))
        return pb.Resource(id=str(resource.id), salon_id=str(resource.salon_id), name=resource.name)

    async def BatchCreateSlots(self, request: pb.BatchCreateSlotsRequest,
                               context: grpc.aio.ServicerContext) -> pb.BatchCreateSlotsResponse:
        caller = principal.current()
        domain.require_admin(caller)
        salon_id = parse_uuid("salon_id", request.salon_id)
        drafts = []
        for i, s in enumerate(request.slots):
            price = s.price if s.HasField("price") else None
            drafts.append(domain.slot_draft(
                i, s.resource_id, optional_instant(s, "start_time", f"slots[{i}].start_time"),
                optional_instant(s, "end_time", f"slots[{i}].end_time"),
                price.currency_code if price else None, price.amount_minor if price else None))
        slots = await self.service.create_slots(caller, salon_id, drafts)
        return pb.BatchCreateSlotsResponse(slots=[slot_pb(s) for s in slots])

    async def ListSlots(self, request: pb.ListSlotsRequest, context: grpc.aio.ServicerContext) -> pb.ListSlotsResponse:
        salon_id = parse_uuid("salon_id", request.salon_id)
        start = domain.require_instant("start_time", optional_instant(request, "start_time"))
        end = domain.require_instant("end_time", optional_instant(request, "end_time"))
        slots, next_token = await self.service.list_slots(principal.current(), salon_id, start, end,
                                                          request.available_only,
                                                          request.page_size, request.page_token)
        return pb.ListSlotsResponse(slots=[slot_pb(s) for s in slots], next_page_token=next_token)

    async def GetSlot(self, request: pb.GetSlotRequest, context: grpc.aio.ServicerContext) -> pb.Slot:
        return slot_pb(await self.service.get_slot(principal.current(), parse_uuid("slot_id", request.slot_id)))

    async def ListBookings(self, request: pb.ListBookingsRequest,
                           context: grpc.aio.ServicerContext) -> pb.ListBookingsResponse:
        salon_id = parse_uuid("salon_id", request.salon_id)
        day = domain.require_day("day", request.day)
        time_zone, holds, next_token = await self.service.list_bookings(
            principal.current(), salon_id, day, request.include_held, request.page_size, request.page_token)
        return pb.ListBookingsResponse(bookings=[booking_pb(h, time_zone) for h in holds], next_page_token=next_token)

    # --- holds -----------------------------------------------------------------------------------

    async def HoldSlot(self, request: pb.HoldSlotRequest, context: grpc.aio.ServicerContext) -> pb.Hold:
        slot_id = parse_uuid("slot_id", request.slot_id)
        caller = principal.current()
        caller.require_role("system")  # the saga holds, naming its customer; no route brings a user
        customer_id = domain.require_key("customer_id", request.customer_id)
        request_id = domain.require_key("request_id", request.request_id)
        offer_seconds = domain.offer_seconds(request.offer_seconds, self.service.settings.hold_ttl_seconds)
        ttl_seconds = domain.hold_ttl_seconds(request.ttl_seconds, self.service.settings.hold_ttl_seconds)
        try:
            hold = await self.service.hold_slot(caller, slot_id, customer_id, request_id, offer_seconds,
                                                ttl_seconds=ttl_seconds)
        except SlotTaken as e:
            raise AlreadyExists(e.message, reason=e.reason, detail=pb.SlotUnavailable(
                slot_id=str(e.slot_id), alternatives=[slot_pb(s) for s in e.alternatives],
                held_alternative=hold_pb(e.offer) if e.offer else None)) from None
        return hold_pb(hold)

    async def ConfirmHold(self, request: pb.ConfirmHoldRequest, context: grpc.aio.ServicerContext) -> pb.Hold:
        hold_id = parse_uuid("hold_id", request.hold_id)
        payment_ref = domain.require_key("payment_ref", request.payment_ref)
        principal.current().require_role("system")  # finishing a purchase: the saga, never a user
        return hold_pb(await self.service.confirm_hold(hold_id, payment_ref))

    async def ReleaseHold(self, request: pb.ReleaseHoldRequest, context: grpc.aio.ServicerContext) -> pb.Hold:
        hold_id = parse_uuid("hold_id", request.hold_id)
        principal.current().require_role("system")  # releasing: the saga, never a user
        return hold_pb(await self.service.release_hold(hold_id))

    async def CancelBooking(self, request: pb.CancelBookingRequest, context: grpc.aio.ServicerContext) -> pb.Hold:
        hold_id = parse_uuid("hold_id", request.hold_id)
        payment_ref = domain.require_key("payment_ref", request.payment_ref)
        principal.current().require_role("system")  # cancelling a purchase: the saga, never a user
        return hold_pb(await self.service.cancel_booking(hold_id, payment_ref))

    async def ExtendHold(self, request: pb.ExtendHoldRequest, context: grpc.aio.ServicerContext) -> pb.Hold:
        hold_id = parse_uuid("hold_id", request.hold_id)
        principal.current().require_role("system")  # the saga extends its hold, never a user
        return hold_pb(await self.service.extend_hold(hold_id, request.seconds))

    async def GetHold(self, request: pb.GetHoldRequest, context: grpc.aio.ServicerContext) -> pb.Hold:
        hold_id = parse_uuid("hold_id", request.hold_id)
        principal.current().require_role("system")  # the saga reads its hold, never a user
        return hold_pb(await self.service.get_hold(hold_id))

    async def DigestHolds(self, request: pb.DigestHoldsRequest,
                          context: grpc.aio.ServicerContext) -> pb.DigestHoldsResponse:
        principal.current().require_role("system")  # the auditor reads every merchant's holds
        start, end = window(request, digest.MAX_WINDOW_SECONDS)
        holds, token = await digest.digest_holds(self.service.pool, start, end, request.page_size, request.page_token,
                                                 request.bucket_count, list(request.buckets))
        return pb.DigestHoldsResponse(holds=[pb.HoldDigest(
            hold_id=h.id, payment_ref=h.payment_ref, status=_STATUS[h.status], cancelled=h.cancelled,
            merchant_id=h.merchant_id, price=common_pb2.Money(currency_code=h.currency, amount_minor=h.price_minor),
            create_time=to_timestamp(h.created_at)) for h in holds], next_page_token=token)

    async def SummarizeHolds(self, request: pb.SummarizeHoldsRequest,
                             context: grpc.aio.ServicerContext) -> pb.SummarizeHoldsResponse:
        principal.current().require_role("system")  # the auditor reads every merchant's holds
        start, end = window(request, digest.MAX_WINDOW_SECONDS)
        found = await digest.summarize_holds(self.service.pool, start, end, request.bucket_count)
        return pb.SummarizeHoldsResponse(buckets=[common_pb2.DigestBucket(
            bucket=b.bucket, count=b.count, fingerprint=b.fingerprint) for b in found])

    # --- services and working hours ----------------------------------------------------------------

    async def CreateService(self, request: pb.CreateServiceRequest, context: grpc.aio.ServicerContext) -> pb.Service:
        caller = principal.current()
        domain.require_admin(caller)
        salon_id = parse_uuid("salon_id", request.salon_id)
        price = request.price if request.HasField("price") else None
        draft = schedule.service_draft(request.name, request.duration_minutes, price.currency_code if price else None,
                                       price.amount_minor if price else None, request.buffer_before_minutes,
                                       request.buffer_after_minutes, list(request.resource_ids))
        return service_pb(await self.schedule.create_service(caller, salon_id, draft))

    async def ListServices(self, request: pb.ListServicesRequest,
                           context: grpc.aio.ServicerContext) -> pb.ListServicesResponse:
        caller = principal.current()
        tenancy.merchant_filter(caller)
        salon_id = parse_uuid("salon_id", request.salon_id)
        found, token = await self.schedule.list_services(caller, salon_id, request.page_size, request.page_token)
        return pb.ListServicesResponse(services=[service_pb(s) for s in found], next_page_token=token)

    async def SetWorkingHours(self, request: pb.SetWorkingHoursRequest,
                              context: grpc.aio.ServicerContext) -> pb.WorkingHours:
        caller = principal.current()
        domain.require_admin(caller)
        salon_id = parse_uuid("salon_id", request.salon_id)
        resource_id = parse_uuid("resource_id", request.resource_id)
        week = schedule.weekly_hours([(i.weekday, i.opens, i.closes) for i in request.intervals])
        await self.schedule.set_working_hours(caller, salon_id, resource_id, week)
        return pb.WorkingHours(resource_id=str(resource_id), intervals=[
            pb.WeeklyInterval(weekday=i.weekday, opens=i.opens, closes=i.closes) for i in week])

    async def SetHoursOverride(self, request: pb.SetHoursOverrideRequest,
                               context: grpc.aio.ServicerContext) -> pb.HoursOverride:
        caller = principal.current()
        domain.require_admin(caller)
        salon_id = parse_uuid("salon_id", request.salon_id)
        resource_id = parse_uuid("resource_id", request.resource_id) if request.resource_id else None
        day, closed, intervals = schedule.day_override(request.day, request.closed,
                                                       [(i.opens, i.closes) for i in request.intervals])
        await self.schedule.set_hours_override(caller, salon_id, resource_id, day, closed, intervals)
        return pb.HoursOverride(salon_id=str(salon_id), resource_id=_id(resource_id), day=day.isoformat(),
                                closed=closed,
                                intervals=[pb.TimeInterval(opens=i.opens, closes=i.closes) for i in intervals])

    async def SetBookingSettings(self, request: pb.SetBookingSettingsRequest,
                                 context: grpc.aio.ServicerContext) -> pb.Salon:
        caller = principal.current()
        caller.require_role("admin")  # of the salon's merchant (the update filters by it)
        tenancy.owning_merchant(caller)
        salon_id = parse_uuid("salon_id", request.salon_id)
        change = schedule.settings_change(
            request.min_notice_minutes if request.HasField("min_notice_minutes") else None,
            request.booking_horizon_days if request.HasField("booking_horizon_days") else None,
            request.time_step_minutes if request.HasField("time_step_minutes") else None)
        return salon_pb(await self.schedule.set_booking_settings(caller, salon_id, change))

    async def GetAvailability(self, request: pb.GetAvailabilityRequest,
                              context: grpc.aio.ServicerContext) -> pb.GetAvailabilityResponse:
        caller = principal.current()
        tenancy.merchant_filter(caller)
        salon_id = parse_uuid("salon_id", request.salon_id)
        service_id = parse_uuid("service_id", request.service_id)
        resource_id = parse_uuid("resource_id", request.resource_id) if request.resource_id else None
        start, end = schedule.day_range(request.start_day, request.end_day)
        time_zone, minutes, times, token = await self.schedule.availability(
            caller, salon_id, service_id, resource_id, start, end, request.page_size, request.page_token)
        length = timedelta(minutes=minutes)
        return pb.GetAvailabilityResponse(time_zone=time_zone, next_page_token=token, times=[
            pb.AvailableTime(start_time=to_timestamp(t.start_time), end_time=to_timestamp(t.start_time + length),
                             local_start_time=domain.local_time(t.start_time, time_zone),
                             resource_ids=[str(r) for r in t.resource_ids]) for t in times])

    async def GetServiceSlot(self, request: pb.GetServiceSlotRequest, context: grpc.aio.ServicerContext) -> pb.Slot:
        caller = principal.current()
        service_id = parse_uuid("service_id", request.service_id)
        resource_id = parse_uuid("resource_id", request.resource_id) if request.resource_id else None
        start = domain.require_instant("start_time", optional_instant(request, "start_time"))
        return slot_pb(await self.schedule.service_slot(caller, service_id, resource_id, start))
