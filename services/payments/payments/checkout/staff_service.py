"""Staff book for a customer, and what staff record about a booking afterwards (docs/checkout.md,
"Staff book for a customer", "No-show"): CreateStaffCheckout, MarkPaidAtVenue, MarkNoShow.

A staff-made checkout is the same saga as the customer's (the same keys, hold, confirm, cancel and
workers): its PENDING row carries the named customer and how it is paid, and `domain.next_step`
starts its payment once held, as for a one-call checkout. A payment link's payment is a PSP intent
without a card (the customer presents one on the PSP's hosted page, then the webhook finishes the
saga as for 3-D Secure); a venue booking is confirmed without any payment. Every write here is one
conditional statement; the reads that follow a refused write only name the reason.
"""
from __future__ import annotations

import logging

import asyncpg

from cuty.payments.v1 import checkout_pb2
from cutylib import errors, tenancy
from cutylib.fields import canonical_uuid, parse_uuid
from cutylib.principal import Principal
from cutylib.telemetry import current_traceparent

from . import no_show_fee, staffbook, views
from .domain import Saga
from .idempotency import request_hash
from .no_show_fee import NoShowFees
from .service import CheckoutService, new_owner

log = logging.getLogger(__name__)

_RETURNING = "RETURNING *, clock_timestamp() AS db_now"

# CreateStaffCheckout's first write, in its Idempotency-Key's statement (idempotency.begin_with):
# the PENDING row of a booking for the named customer, with how it is paid and who made it, and
# its merchant already (the staff's: the slot was found among theirs; the hold's must be the same).
# $17: a link's offer of the slot's no-show fee (NULL: none).
INSERT_STAFF_PENDING = f"""
first AS (
    INSERT INTO checkouts (id, customer_id, kind, slot_id, quantity, lease_owner, lease_until, next_run_at,
                           traceparent, settle, created_by, link_ttl_seconds, venue_status, merchant_id,
                           no_show_fee_offered_minor)
    SELECT began.resource_id, $8::text, 'booking', $9::uuid, 1, $10::text,
           clock_timestamp() + make_interval(secs => $11::float8),
           clock_timestamp() + make_interval(secs => $11::float8), $12::text, $13::text, $14::text, $15::int,
           CASE WHEN $13::text = 'venue' THEN 'unpaid' END, $16::text, $17::bigint
    FROM began
    ON CONFLICT (id) DO NOTHING
    {_RETURNING}
)
"""
# One guest customer per merchant and contact (the no-op update makes the existing row answer).
UPSERT_GUEST = """
INSERT INTO guest_customers (merchant_id, name, phone, email) VALUES ($1, $2, $3, $4)
ON CONFLICT (merchant_id, contact) DO UPDATE SET name = guest_customers.name
RETURNING id
"""
GUEST_EXISTS = "SELECT 1 FROM guest_customers WHERE merchant_id = $1 AND id = $2"
# Paid at the desk: only a completed, unpaid venue booking of the caller's merchant, once.
MARK_PAID = f"""
UPDATE checkouts SET venue_status = 'paid', venue_method = $3, venue_amount_minor = $4, venue_reference = $5,
                     venue_paid_by = $6, venue_paid_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = $1 AND merchant_id = $2 AND state = 'COMPLETED' AND settle = 'venue' AND venue_status = 'unpaid'
  AND no_show_at IS NULL
{_RETURNING}
"""
# A no-show: a completed booking of the caller's merchant, not paid at the desk, from its start
# until NO_SHOW_WINDOW_HOURS after, on the database's clock; once. A no-show fee the customer
# accepted at purchase becomes due in the same statement (no_show_fee.py charges it).
MARK_NO_SHOW = f"""
UPDATE checkouts SET no_show_at = clock_timestamp(), no_show_by = $3, updated_at = clock_timestamp(),
                     no_show_fee_status = CASE WHEN no_show_fee_minor IS NOT NULL THEN 'due' END,
                     no_show_fee_next_at = CASE WHEN no_show_fee_minor IS NOT NULL
                                                THEN clock_timestamp() + make_interval(secs => $4::float8) END
WHERE id = $1 AND merchant_id = $2 AND kind = 'booking' AND state = 'COMPLETED' AND no_show_at IS NULL
  AND venue_status IS DISTINCT FROM 'paid'
  AND clock_timestamp() >= start_time
  AND clock_timestamp() < start_time + make_interval(hours => {staffbook.NO_SHOW_WINDOW_HOURS})
{_RETURNING}
"""
COUNT_NO_SHOWS = """
SELECT count(*) FROM checkouts WHERE merchant_id = $1 AND customer_id = $2 AND no_show_at IS NOT NULL
"""
GET_OF_MERCHANT = "SELECT *, clock_timestamp() AS db_now FROM checkouts WHERE id = $1 AND merchant_id = $2"


def _who(caller: Principal) -> str:
    return f"{caller.role}:{caller.subject}"


class StaffBookings:
    def __init__(self, checkouts: CheckoutService, default_link_ttl_seconds: int, fees: NoShowFees):
        self.checkouts = checkouts
        self.pool: asyncpg.Pool = checkouts.pool
        self.default_link_ttl_seconds = default_link_ttl_seconds
        self.fees = fees

    # -- CreateStaffCheckout ----------------------------------------------------------------------
    async def create(self, caller: Principal, request: checkout_pb2.CreateStaffCheckoutRequest,
                     key: str) -> checkout_pb2.Checkout:
        caller.require_role("staff", "admin")
        caller.require_subject()
        merchant = tenancy.merchant_filter(caller)
        req = staffbook.validate(request, self.default_link_ttl_seconds)
        booking = self.checkouts.holds.booking
        if req.slot_id is not None:
            slot_id = canonical_uuid("slot_id", req.slot_id)
        else:
            if not request.HasField("start_time"):
                raise errors.InvalidArgument("start_time", "start_time is required with service_id")
            slot_id = await booking.service_slot(
                canonical_uuid("service_id", request.service_id), request.start_time,
                canonical_uuid("resource_id", request.resource_id) if request.resource_id else "")
        # The checkout is the caller's merchant's from the start; a slot of another merchant is
        # NOT_FOUND, as a missing one, once the hold's answer names the slot's merchant (steps._hold).
        customer_id = await self._customer(caller, merchant, req)
        who = _who(caller)
        h = request_hash("staff-create", slot_id, customer_id, req.settle, str(req.link_ttl_seconds or 0))
        owner = new_owner("staff-create")
        first = (INSERT_STAFF_PENDING, (customer_id, slot_id, owner, self.checkouts.lease_seconds,
                                        current_traceparent(), req.settle, who, req.link_ttl_seconds, merchant,
                                        await self._offered_fee(slot_id) if req.settle == "link" else None))
        async with self.checkouts.keys.claim(who, "staff-create", key, h, first) as claim:  # or Replay
            claim.finish(await self.checkouts._create(claim.resource_id, owner, claim.row))
        return self.for_staff(views.checkout_pb(claim.answer))

    async def _offered_fee(self, slot_id: str) -> int | None:
        """What a payment link offers its customer to accept: the no-show fee the slot names now
        (the salon's policy), which its hosted page shows; staff never choose or accept it. None:
        the slot names none (or is not found: the hold then answers that)."""
        try:
            slot = await self.checkouts.holds.booking.get_slot(slot_id)
        except errors.NotFound:
            return None
        return slot.no_show_fee.amount_minor if slot.HasField("no_show_fee") else None

    async def _customer(self, caller: Principal, merchant: str, req: staffbook.StaffRequest) -> str:
        """The checkout's customer: the id given (a guest id must be one of this merchant's guests),
        or the guest customer of the contact, made on first use."""
        if req.contact is None and not req.customer_id.startswith(staffbook.GUEST_PREFIX):
            return req.customer_id  # a customer of the platform: their own list shows the booking
        async with tenancy.scoped(self.pool, caller) as uow:
            if req.contact is None:  # a guest of this merchant (guests are never deleted)
                guest = parse_uuid("customer_id", req.customer_id.removeprefix(staffbook.GUEST_PREFIX))
                if await uow.conn.fetchval(GUEST_EXISTS, merchant, guest) is None:
                    raise errors.NotFound(f"customer {req.customer_id} not found", field="customer_id")
                return req.customer_id
            guest = await uow.conn.fetchval(UPSERT_GUEST, merchant, req.contact.name, req.contact.phone,
                                            req.contact.email)
            await uow.commit()
        return staffbook.guest_customer_id(guest)

    @staticmethod
    def for_staff(answer: checkout_pb2.Checkout) -> checkout_pb2.Checkout:
        """Staff get the link to send (staff_booking.link_url), never the customer's client secret."""
        out = checkout_pb2.Checkout()
        out.CopyFrom(answer)
        if out.HasField("payment"):
            out.payment.ClearField("next_action")
            out.payment.client_secret = ""
        return out

    # -- MarkPaidAtVenue / MarkNoShow -------------------------------------------------------------
    async def mark_paid(self, caller: Principal, request: checkout_pb2.MarkPaidAtVenueRequest) -> checkout_pb2.Checkout:
        caller.require_role("staff", "admin")
        caller.require_subject()
        checkout_id = canonical_uuid("checkout_id", request.checkout_id)
        method, amount, currency, reference = staffbook.venue_payment(request)
        merchant = tenancy.merchant_filter(caller)
        async with tenancy.scoped(self.pool, caller) as uow:
            row = await uow.conn.fetchrow(MARK_PAID, checkout_id, merchant, method, amount, reference, _who(caller))
            saga = Saga.from_row(row) if row is not None else await self._read(uow.conn, checkout_id, merchant)
            if row is None:
                staffbook.refuse_mark_paid(saga, method, amount, reference)
            elif currency != saga.currency:
                raise errors.InvalidArgument("amount.currency_code", f"the booking is in {saga.currency}, "
                                                                     f"got {currency}")
            await uow.commit()
        return await self._answer(caller, saga)

    async def mark_no_show(self, caller: Principal, checkout_id: str) -> checkout_pb2.Checkout:
        caller.require_role("staff", "admin")
        caller.require_subject()
        checkout_id = canonical_uuid("checkout_id", checkout_id)
        merchant = tenancy.merchant_filter(caller)
        async with tenancy.scoped(self.pool, caller) as uow:
            row = await uow.conn.fetchrow(MARK_NO_SHOW, checkout_id, merchant, _who(caller), self.fees.retry_seconds)
            if row is None:
                saga = await self._read(uow.conn, checkout_id, merchant)
                staffbook.refuse_no_show(saga)
            else:
                saga = Saga.from_row(row)
            await uow.commit()
        if saga.no_show_fee_status == no_show_fee.DUE:
            # Charged now when it can be; a fee left due (the PSP away, this process gone) is the
            # worker's (no_show_fee.NoShowFees.run), and the answer says 'due' meanwhile.
            try:
                await self.fees.charge(saga.id)
            except Exception:  # noqa: BLE001 - the no-show is recorded; the worker charges the fee
                log.exception("no-show fee not charged now; the worker will", extra={"checkout_id": saga.id})
            async with tenancy.scoped(self.pool, caller) as uow:
                saga = await self._read(uow.conn, checkout_id, merchant)
        return await self._answer(caller, saga)

    @staticmethod
    async def _read(conn, checkout_id: str, merchant: str) -> Saga:
        row = await conn.fetchrow(GET_OF_MERCHANT, checkout_id, merchant)
        if row is None:  # another merchant's checkout does not exist for this caller
            raise errors.NotFound(f"checkout {checkout_id} not found")
        return Saga.from_row(row)

    async def _answer(self, caller: Principal, saga: Saga) -> checkout_pb2.Checkout:
        answer = views.checkout_pb(await self.checkouts.view_for(caller, saga))
        await self.count_no_shows(caller, saga, answer, always=True)
        return answer

    async def count_no_shows(self, caller: Principal, saga: Saga, answer: checkout_pb2.Checkout, *,
                             always: bool = False) -> None:
        """The customer's no-shows at the checkout's merchant, for that merchant's staff and admins
        only (one index probe). A customer's own booking with none shows no staff_booking."""
        if caller.role not in ("staff", "admin") or saga.kind != "booking" or saga.merchant_id is None:
            return
        async with tenancy.scoped(self.pool, caller) as uow:
            count = await uow.conn.fetchval(COUNT_NO_SHOWS, saga.merchant_id, saga.customer_id)
        if count or always or answer.HasField("staff_booking"):
            answer.staff_booking.customer_no_shows = count
