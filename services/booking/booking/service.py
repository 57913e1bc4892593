"""Booking's use cases: each reads like the rule it implements; the database decides every race.

Use cases that are one statement (all the hold ones) run it straight on the pool: the statement is
its own transaction, and HoldSlot's single round trip is the point (docs/booking.md).

Merchants (docs/tenancy.md, "Booking"): a staff or admin caller works in its merchant's
transaction (`scoped`: Row-Level Security) and every query filters by its merchant
(`tenancy.merchant_filter`); another merchant's salon, slot or hold answers NOT_FOUND like a
missing one. Customers, the operator and the system see every merchant and keep their paths.
"""
from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import AsyncIterator

import asyncpg

from cutylib import tenancy
from cutylib.config import Settings
from cutylib.db import reports
from cutylib.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from cutylib.principal import Principal
from cutylib.telemetry import set_span_attributes

from . import domain, metrics, schedule
from .domain import Hold, Resource, Salon, Slot, SlotDraft
from .repository import Holds, Slots
from .schedule_repository import Schedule
from .taken import TakenSlots
from .unit_of_work import BookingUnitOfWork, db_now, scoped

log = logging.getLogger(__name__)

MAX_ALTERNATIVES = 3


class SlotTaken(AlreadyExists):
    """HoldSlot lost: the time is held or booked. Carries the alternatives offered instead, and the
    one held for the loser (`offer`), if asked for and one could be held."""

    def __init__(self, slot_id: uuid.UUID, alternatives: list[Slot], offer: Hold | None = None):
        held = f"; alternative {offer.slot_id} is held for you until {offer.expires_at.isoformat()}" if offer else ""
        super().__init__(f"slot {slot_id} is held or booked by someone else; "
                         f"{len(alternatives)} alternative(s) offered{held}", reason="slot-unavailable")
        self.slot_id = slot_id
        self.alternatives = alternatives
        self.offer = offer


class BookingService:
    def __init__(self, pool: asyncpg.Pool, settings: Settings):
        self.pool = pool
        self.settings = settings
        self.holds = Holds(pool)
        self.slots = Slots(pool)
        # The losers of hot slots, answered from memory while this replica listens (taken.py).
        self.taken = TakenSlots()

    def uow(self) -> BookingUnitOfWork:
        return BookingUnitOfWork(self.pool)

    @asynccontextmanager
    async def _reading(self, caller: Principal, pool=None) -> AsyncIterator[tuple[Slots, Holds, str | None]]:
        """Repositories for one read and the caller's merchant filter: straight on the pool for
        callers not bound to a merchant (no extra round trip), in a scoped transaction otherwise.
        `pool`: another pool to read from (the reporting pool, `cutylib.db.reports`)."""
        merchant = tenancy.merchant_filter(caller)
        if merchant is None and pool is None:
            yield self.slots, self.holds, None
            return
        async with scoped(pool or self.pool, caller) as uow:
            yield uow.slots, uow.holds, merchant

    # --- catalog (admin) -------------------------------------------------------------------------

    async def create_salon(self, caller: Principal, name: str, time_zone: str,
                           policy: domain.CancellationPolicy = domain.CancellationPolicy()) -> Salon:
        """In the admin's own merchant, with its cancellation policy."""
        merchant = tenancy.owning_merchant(caller)
        async with scoped(self.pool, caller) as uow:
            salon = await uow.salons.add(merchant, name, time_zone, policy)
            await uow.commit()
        return salon

    async def set_cancellation_policy(self, caller: Principal, salon_id: uuid.UUID, hours: int | None,
                                      fee_percent: int | None, no_show_fee_percent: int | None = None) -> Salon:
        """The admin's own merchant's salon only (another's: NOT_FOUND, as a missing one).
        Bookings already held or bought keep their copy of the old policy."""
        merchant = tenancy.owning_merchant(caller)
        async with scoped(self.pool, caller) as uow:
            salon = await uow.salons.set_policy(salon_id, merchant, hours, fee_percent, no_show_fee_percent)
            if salon is None:
                raise NotFound(f"salon {salon_id} not found")
            await uow.commit()
        log.info("cancellation policy changed", extra={"salon_id": str(salon_id), "merchant_id": merchant,
                                                       "free_cancellation_hours": salon.free_cancellation_hours,
                                                       "cancellation_fee_percent": salon.cancellation_fee_percent,
                                                       "no_show_fee_percent": salon.no_show_fee_percent})
        return salon

    async def create_resource(self, caller: Principal, salon_id: uuid.UUID, name: str) -> Resource:
        async with scoped(self.pool, caller) as uow:
            resource = await uow.resources.add(salon_id, name, tenancy.merchant_filter(caller))
            if resource is None:
                raise NotFound(f"salon {salon_id} not found")
            await uow.commit()
        return resource

    async def create_slots(self, caller: Principal, salon_id: uuid.UUID, drafts: list[SlotDraft]) -> list[Slot]:
        """All or nothing: one bad slot and the batch is refused."""
        merchant = tenancy.merchant_filter(caller)
        async with scoped(self.pool, caller) as uow:
            domain.check_slot_batch(drafts, await db_now(uow.conn))
            salon = await uow.salons.get(salon_id, merchant)
            if salon is None:
                raise NotFound(f"salon {salon_id} not found")
            created = await uow.slots.add_batch(salon, drafts)
            for d in drafts:
                if d.index not in created:  # leaving the uow uncommitted rolls the others back
                    raise NotFound(f"slots[{d.index}].resource_id: resource {d.resource_id} is not a resource "
                                   f"of salon {salon_id}", field=f"slots[{d.index}].resource_id")
            await uow.commit()
        return [created[d.index] for d in drafts]

    async def list_slots(self, caller: Principal, salon_id: uuid.UUID, start: datetime, end: datetime,
                         available_only: bool, page_size: int = 0, page_token: str = "") -> tuple[list[Slot], str]:
        """One page of the salon's slots and the next page's token ("" on the last page). Staff and
        admins list only their merchant's salons; customers and the operator any salon."""
        domain.check_window(start, end)
        size = domain.page_size(page_size)
        after = domain.decode_page_token(page_token)
        async with self._reading(caller) as (repo, _, merchant):
            slots = await repo.list(salon_id, start, end, available_only, after, size + 1, merchant)
        if slots is None:
            raise NotFound(f"salon {salon_id} not found")
        if len(slots) <= size:
            return slots, ""
        last = slots[size - 1]
        return slots[:size], domain.encode_page_token(domain.SlotCursor(last.start_time, last.resource_id, last.id))

    async def get_slot(self, caller: Principal, slot_id: uuid.UUID) -> Slot:
        async with self._reading(caller) as (repo, _, merchant):
            slot = await repo.get(slot_id, merchant)
        if slot is None:
            raise NotFound(f"slot {slot_id} not found")
        return slot

    async def list_bookings(self, caller: Principal, salon_id: uuid.UUID, day, include_held: bool,
                            page_size: int = 0, page_token: str = "") -> tuple[str, list[Hold], str]:
        """One page of the salon's agenda for its local `day` (time zone, holds, next
        token). Staff and admins only of their merchant's salons (another's: NOT_FOUND); neither
        customers nor the operator (unaudited here)."""
        domain.require_agenda_reader(caller)
        size = domain.page_size(page_size)
        query = domain.agenda_query(salon_id, day, include_held)
        after = domain.decode_agenda_token(page_token, query)
        async with self._reading(caller, reports(self.pool)) as (_, holds, merchant):  # a report: its own pool
            found = await holds.agenda(salon_id, day, include_held, after, size + 1, merchant)
        if found is None:
            raise NotFound(f"salon {salon_id} not found")
        time_zone, entries = found
        if len(entries) <= size:
            return time_zone, entries, ""
        last = entries[size - 1]
        return time_zone, entries[:size], domain.encode_agenda_token(
            query, domain.SlotCursor(last.start_time, last.resource_id, last.id))

    # --- holds -----------------------------------------------------------------------------------

    async def hold_slot(self, caller: Principal, slot_id: uuid.UUID, customer_id: str, request_id: str,
                        offer_seconds: int = 0, ttl_seconds: int | None = None) -> Hold:
        """`offer_seconds` > 0: a loser gets the first free alternative held for them that long
        (docs/booking.md, "The race loser is kept"); such a loser always asks the database, since
        only the database can hold it."""
        if caller.role in tenancy.MERCHANT_ROLES:
            # Not a path of the checkout (the orchestrator holds as `system`), but a merchant's
            # user holds only its merchant's slots. A slot's merchant never changes.
            await self.get_slot(caller, slot_id)
        known = None if offer_seconds else self.taken.answer(slot_id, customer_id)
        if known is not None:  # a loser of a slot known to be blocked: no database round trip
            metrics.REGISTRY.losers_from_memory.inc()
            self._lost(known)
            raise SlotTaken(slot_id, list(known))
        outcome, hold, alternatives, taken_over, offer = await self.holds.take(
            slot_id, customer_id, request_id, ttl_seconds=ttl_seconds or self.settings.hold_ttl_seconds,
            max_active=self.settings.max_active_holds, max_alternatives=MAX_ALTERNATIVES, offer_seconds=offer_seconds)
        if hold is not None:
            set_span_attributes(hold_id=str(hold.id))
        if outcome == "held":
            metrics.REGISTRY.holds_taken.inc()
            if taken_over:
                metrics.REGISTRY.holds_taken_over.inc(taken_over)
            return hold
        if outcome == "existing":  # an idempotent retry: the hold as it is now (maybe confirmed)
            return hold
        if outcome == "adopted":  # the customer accepts the alternative held for them
            metrics.REGISTRY.offers_accepted.inc()
            return hold
        if outcome == "taken" and offer_seconds:
            self._lost(alternatives)
            if offer is not None:
                metrics.REGISTRY.offers_made.inc()
            raise SlotTaken(slot_id, alternatives, offer)
        if outcome == "taken":
            self._lost(alternatives)
            generation = self.taken.start_filling(slot_id)
            if generation is not None:  # what blocks it, so that the next losers need no round trip
                blocked = None
                try:
                    blocked = await self.holds.blocking(slot_id)
                finally:
                    self.taken.remember(slot_id, blocked, alternatives, generation)
            raise SlotTaken(slot_id, alternatives)
        if outcome == "cap":
            metrics.REGISTRY.holds_capped.inc()
            raise ResourceExhausted(
                f"customer has {self.settings.max_active_holds} active holds already (the most allowed); "
                "confirm or release one first", reason="too-many-active-holds")
        if outcome == "request_reused":
            raise InvalidArgument("request_id", f"request_id {request_id!r} was already used for slot {hold.slot_id}, "
                                                f"not {slot_id}", reason="request-id-reused")
        if outcome == "slot_not_found":
            raise NotFound(f"slot {slot_id} not found")
        if outcome == "slot_started":
            raise FailedPrecondition(f"slot {slot_id} has already started", reason="slot-started")
        if outcome == "outside_window":
            raise FailedPrecondition(f"slot {slot_id} is before the salon's minimum notice or beyond its booking "
                                     "horizon", reason="outside-booking-window")
        raise RuntimeError(f"booking_take_hold returned an unknown outcome {outcome!r}")

    @staticmethod
    def _lost(alternatives) -> None:
        metrics.REGISTRY.hold_conflicts.labels("yes" if alternatives else "no").inc()
        metrics.REGISTRY.alternatives_offered.inc(len(alternatives or ()))

    async def confirm_hold(self, hold_id: uuid.UUID, payment_ref: str) -> Hold:
        outcome, hold = await self.holds.confirm(hold_id, payment_ref, self.settings.confirm_cutoff_seconds)
        set_span_attributes(hold_id=str(hold_id))
        if outcome == "confirmed":
            metrics.REGISTRY.confirmations.labels("confirmed").inc()
            return hold
        if outcome == "reacquired":
            metrics.REGISTRY.confirmations.labels("reacquired").inc()
            log.info("expired hold re-acquired on confirm", extra={"hold_id": str(hold_id)})
            return hold
        if outcome == "not_found":
            raise NotFound(f"hold {hold_id} not found")
        if outcome == "lost":
            metrics.REGISTRY.confirmations.labels("hold_lost").inc()
            raise FailedPrecondition(f"hold {hold_id} expired and its time is held or booked by someone else",
                                     reason="hold-lost")
        if outcome == "released":
            raise FailedPrecondition(f"hold {hold_id} was released", reason="hold-released")
        if outcome == "started":  # a late payment: the appointment has started
            metrics.REGISTRY.confirmations.labels("too_late").inc()
            raise FailedPrecondition(f"hold {hold_id}: the slot has started (or starts within "
                                     f"{self.settings.confirm_cutoff_seconds:g}s); it is not confirmed",
                                     reason="slot-started")
        if outcome == "payment_ref_mismatch":
            raise FailedPrecondition(f"hold {hold_id} is confirmed already, by another payment",
                                     reason="hold-confirmed-by-other-payment")
        raise RuntimeError(f"booking_confirm_hold returned an unknown outcome {outcome!r}")

    async def release_hold(self, hold_id: uuid.UUID) -> Hold:
        set_span_attributes(hold_id=str(hold_id))
        released = await self.holds.release(hold_id)
        if released is not None:
            self.taken.freed(str(released.resource_id))  # here at once; other replicas by NOTIFY
            return released
        # Nothing live to release: released or expired already is success (idempotent).
        hold = await self.get_hold(hold_id)
        if hold.status == domain.CONFIRMED:
            raise FailedPrecondition(f"hold {hold_id} is confirmed; a booking is not released", reason="hold-confirmed")
        return hold

    async def cancel_booking(self, hold_id: uuid.UUID, payment_ref: str) -> Hold:
        """A booking cancelled after purchase (the saga's CANCELLING step): the confirmed
        hold of `payment_ref` is released, so its time is bookable again. Idempotent: a repeat
        answers the cancelled hold. The refund is the saga's, never booking's."""
        set_span_attributes(hold_id=str(hold_id))
        cancelled = await self.holds.cancel_booking(hold_id, payment_ref)
        if cancelled is not None:
            self.taken.freed(str(cancelled.resource_id))
            return cancelled
        hold = await self.get_hold(hold_id)
        if hold.status == domain.RELEASED and hold.cancelled_payment_ref == payment_ref:
            return hold  # cancelled already: the same answer
        if hold.status == domain.CONFIRMED:
            raise FailedPrecondition(f"hold {hold_id} is confirmed by another payment",
                                     reason="hold-confirmed-by-other-payment")
        raise FailedPrecondition(f"hold {hold_id} is {hold.status}, not a confirmed booking",
                                 reason=f"hold-{hold.status}")

    async def extend_hold(self, hold_id: uuid.UUID, seconds: int) -> Hold:
        seconds = domain.extension_seconds(seconds, self.settings.hold_max_extension_seconds)
        set_span_attributes(hold_id=str(hold_id))
        extended = await self.holds.extend(hold_id, seconds)
        if extended is not None:
            return extended
        hold = await self.get_hold(hold_id)
        if hold.status == domain.HELD and hold.extended:
            return hold  # a retry of the one extension: no second one, same answer
        if hold.status == domain.EXPIRED:
            raise FailedPrecondition(f"hold {hold_id} has expired; hold the slot again", reason="hold-expired")
        raise FailedPrecondition(f"hold {hold_id} is {hold.status}, only a held hold can be extended",
                                 reason=f"hold-{hold.status}")

    async def get_hold(self, hold_id: uuid.UUID) -> Hold:
        """Any merchant's hold: the hold RPCs are the saga's alone, called as `system` (no route
        brings a user to them, grpc_api.SYSTEM_RPCS)."""
        hold = await self.holds.get(hold_id)
        if hold is None:
            raise NotFound(f"hold {hold_id} not found")
        return hold


class ScheduleService:
    """Services, working hours, booking settings and availability (docs/booking.md, "Services and
    working hours"). Admins of the salon's merchant change them (another merchant's salon:
    NOT_FOUND, as a missing one); availability is for every signed-in user, staff and admins of
    their merchant's salons only."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def create_service(self, caller: Principal, salon_id: uuid.UUID, draft) -> "schedule.Service":
        async with scoped(self.pool, caller) as uow:
            service, missing = await uow.schedule.add_service(salon_id, draft, tenancy.merchant_filter(caller))
            if service is None:
                raise NotFound(f"salon {salon_id} not found")
            if missing:  # leaving the uow uncommitted rolls the service back
                i = draft.resource_ids.index(missing[0])
                raise NotFound(f"resource_ids[{i}]: resource {missing[0]} is not a resource of salon {salon_id}",
                               field=f"resource_ids[{i}]")
            await uow.commit()
        return service

    async def list_services(self, caller: Principal, salon_id: uuid.UUID, page_size: int,
                            page_token: str) -> tuple[list, str]:
        size = domain.page_size(page_size)
        query = schedule.services_query(salon_id)
        after = schedule.decode_services_token(page_token, query)
        async with scoped(self.pool, caller) as uow:
            found = await uow.schedule.services(salon_id, after, size + 1, tenancy.merchant_filter(caller))
        if found is None:
            raise NotFound(f"salon {salon_id} not found")
        if len(found) <= size:
            return found, ""
        last = found[size - 1]
        return found[:size], schedule.encode_services_token(query, last.created_at, last.id)

    async def set_working_hours(self, caller: Principal, salon_id: uuid.UUID, resource_id: uuid.UUID,
                                intervals: list) -> list:
        async with scoped(self.pool, caller) as uow:
            if not await uow.schedule.set_week(salon_id, resource_id, intervals, tenancy.merchant_filter(caller)):
                raise NotFound(f"resource {resource_id} of salon {salon_id} not found")
            await uow.commit()
        return intervals

    async def set_hours_override(self, caller: Principal, salon_id: uuid.UUID, resource_id: uuid.UUID | None,
                                 day, closed: bool, intervals: list) -> None:
        async with scoped(self.pool, caller) as uow:
            outcome = await uow.schedule.set_override(salon_id, resource_id, day, closed, intervals,
                                                      tenancy.merchant_filter(caller))
            if outcome == "salon_not_found":
                raise NotFound(f"salon {salon_id} not found")
            if outcome == "resource_not_found":
                raise NotFound(f"resource {resource_id} is not a resource of salon {salon_id}", field="resource_id")
            await uow.commit()

    async def set_booking_settings(self, caller: Principal, salon_id: uuid.UUID, change) -> Salon:
        merchant = tenancy.owning_merchant(caller)
        async with scoped(self.pool, caller) as uow:
            salon = await uow.schedule.set_settings(salon_id, merchant, change)
            if salon is None:
                raise NotFound(f"salon {salon_id} not found")
            await uow.commit()
        return salon

    async def availability(self, caller: Principal, salon_id: uuid.UUID, service_id: uuid.UUID,
                           resource_id: uuid.UUID | None, start, end, page_size: int,
                           page_token: str) -> tuple[str, int, list, str]:
        """(the salon's zone, the service's duration, one page of free times, the next token)."""
        size = schedule.times_page_size(page_size)
        query = schedule.availability_query(service_id, start, end, resource_id)
        after = schedule.decode_times_token(page_token, query)
        if after is not None:
            after = after + timedelta(microseconds=1)  # strictly after the previous page's last time
        merchant = tenancy.merchant_filter(caller)
        if merchant is None:  # one statement straight on the pool: no BEGIN/COMMIT round trips
            found = await Schedule(self.pool).availability(service_id, salon_id, resource_id, start, end, after,
                                                           size + 1, None)
        else:
            async with scoped(self.pool, caller) as uow:
                found = await uow.schedule.availability(service_id, salon_id, resource_id, start, end, after,
                                                        size + 1, merchant)
        if found is None:
            raise NotFound(f"service {service_id} of salon {salon_id} not found")
        time_zone, minutes, times = found
        if len(times) <= size:
            return time_zone, minutes, times, ""
        return time_zone, minutes, times[:size], schedule.encode_times_token(query, times[size - 1].start_time)

    async def service_slot(self, caller: Principal, service_id: uuid.UUID, resource_id: uuid.UUID | None,
                           start: datetime) -> Slot:
        async with scoped(self.pool, caller) as uow:
            outcome, slot = await uow.schedule.service_slot(service_id, resource_id, start,
                                                            tenancy.merchant_filter(caller))
            await uow.commit()
        if outcome == "service_not_found":
            raise NotFound(f"service {service_id} not found")
        if outcome == "resource_not_able":
            raise InvalidArgument("resource_id", f"resource {resource_id} does not perform service {service_id}")
        if outcome == "off_grid":
            raise InvalidArgument("start_time", f"start_time {start.isoformat()} is not on the salon's grid of "
                                                "start times (GetAvailability answers the free ones)")
        return slot
