"""Booking's pure rules: what a valid request is, hold states, who may act on a hold, and how an
instant reads on a salon's wall clock. No I/O; unit-tested without a database.

The invariants themselves (no overlap, one hold per request id, the active-hold cap) are the
database's job (migrations/0001_baseline.sql); these rules only reject input before it gets there.
"""
from __future__ import annotations

import functools
import uuid
import zoneinfo
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone

from cutylib import paging, tenancy
from cutylib.errors import InvalidArgument
from cutylib.fields import parse_uuid
from cutylib.money import require_money, worth_of_euros_minor
from cutylib.principal import Principal


HELD, CONFIRMED, RELEASED, EXPIRED = "held", "confirmed", "released", "expired"
STATUSES = (HELD, CONFIRMED, RELEASED, EXPIRED)

MAX_NAME = 200
MAX_KEY = 200  # customer ids, request ids, payment refs: opaque strings chosen by callers
MAX_BATCH = 1000
MAX_LIST_WINDOW = timedelta(days=93)
# A slot's price at the most: about a million euros' worth in its currency (cutylib.money: one
# number of minor units for every currency would be 52 EUR in rupiah and a fortune in dinars). An
# admin's typo or worse would otherwise be a price any card could be asked for: a customer buying
# the slot, or moving a booking to it (docs/security.md, "Who may spend a customer's card").
MAX_SLOT_PRICE_EUROS = 1_000_000


def max_slot_price_minor(currency: str) -> int:
    return worth_of_euros_minor(currency, MAX_SLOT_PRICE_EUROS)
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 100, 500
ADMIN_ROLES = ("admin", "system")
# Postgres and zoneinfo both list these, but none is a place: a salon's zone must be one.
_NOT_PLACES = frozenset({"localtime", "posixrules", "Factory"})


@dataclass(frozen=True)
class Salon:
    id: uuid.UUID
    name: str
    time_zone: str
    merchant_id: str = ""
    # The cancellation policy (docs/booking.md, "Cancellation policy").
    free_cancellation_hours: int = 24
    cancellation_fee_percent: int = 0
    # Booking settings of services (docs/booking.md, "Services and working hours").
    min_notice_minutes: int = 60
    booking_horizon_days: int = 90
    time_step_minutes: int = 15
    # The no-show fee (docs/booking.md, "No-show fee"): this percentage of a booking's price, charged
    # off-session when staff mark a no-show, only if the customer accepted it at purchase.
    no_show_fee_percent: int = 0


@dataclass(frozen=True)
class Resource:
    id: uuid.UUID
    salon_id: uuid.UUID
    name: str


@dataclass(frozen=True)
class Slot:
    id: uuid.UUID
    salon_id: uuid.UUID
    resource_id: uuid.UUID
    start_time: datetime
    end_time: datetime
    price_minor: int
    currency: str
    time_zone: str
    available: bool
    service_id: uuid.UUID | None = None  # a service slot (resource_id None: any able resource)
    merchant_id: str = ""  # its salon's merchant
    # Its salon's no-show fee for it now (a percentage of price_minor, rounded down); 0: none.
    no_show_fee_minor: int = 0

    @property
    def local_start_time(self) -> str:
        return local_time(self.start_time, self.time_zone)


@dataclass(frozen=True)
class Hold:
    id: uuid.UUID
    slot_id: uuid.UUID
    salon_id: uuid.UUID
    resource_id: uuid.UUID
    customer_id: str
    request_id: str
    status: str  # effective: a 'held' row past its expiry reads as 'expired' (effective_status)
    start_time: datetime
    end_time: datetime
    price_minor: int
    currency: str
    expires_at: datetime
    extended: bool
    payment_ref: str
    created_at: datetime
    merchant_id: str = ""  # the slot's merchant (docs/tenancy.md, "Booking")
    # Its salon's cancellation policy when the hold was taken.
    free_cancellation_hours: int = 24
    cancellation_fee_percent: int = 0
    # The payment a booking cancelled after purchase had been confirmed with ("" if none).
    cancelled_payment_ref: str = ""
    service_id: uuid.UUID | None = None
    buffer_before_minutes: int = 0
    buffer_after_minutes: int = 0
    offered: bool = False  # a short hold offered to a race loser (docs/booking.md)


@dataclass(frozen=True)
class SlotDraft:
    """One slot of a BatchCreateSlots request, shape-checked; `index` names it in errors."""
    index: int
    resource_id: uuid.UUID
    start_time: datetime
    end_time: datetime
    price_minor: int
    currency: str


def effective_status(status: str, expires_at: datetime, now: datetime) -> str:
    """A hold is 'held' only until its expiry (database clock), swept or not (invariant 2,
    docs/architecture.md)."""
    if status == HELD and expires_at <= now:
        return EXPIRED
    return status


# --- input ---------------------------------------------------------------------------------------

# A salon's cancellation policy when CreateSalon does not give one (docs/booking.md).
DEFAULT_FREE_CANCELLATION_HOURS, DEFAULT_CANCELLATION_FEE_PERCENT = 24, 0
MAX_FREE_CANCELLATION_HOURS = 8760  # a year; the database's CHECK says the same


@dataclass(frozen=True)
class CancellationPolicy:
    free_cancellation_hours: int = DEFAULT_FREE_CANCELLATION_HOURS
    cancellation_fee_percent: int = DEFAULT_CANCELLATION_FEE_PERCENT
    no_show_fee_percent: int = 0


def cancellation_policy(hours: int | None, fee_percent: int | None,
                        no_show_fee_percent: int | None = None) -> CancellationPolicy:
    """CreateSalon's policy fields, checked (None: the default)."""
    hours, fee_percent = policy_change(hours, fee_percent)
    return CancellationPolicy(DEFAULT_FREE_CANCELLATION_HOURS if hours is None else hours,
                              DEFAULT_CANCELLATION_FEE_PERCENT if fee_percent is None else fee_percent,
                              no_show_fee_percent or 0)


def no_show_fee_minor(price_minor: int, percent: int) -> int:
    """A booking's no-show fee: `percent` of its price, rounded down (as the slot read computes it)."""
    return price_minor * percent // 100


def policy_change(hours: int | None, fee_percent: int | None) -> tuple[int | None, int | None]:
    """Policy fields as given (None: not given). Their ranges are the contract's rules
    (booking.proto: hours 0..MAX_FREE_CANCELLATION_HOURS, fee 0..100), checked before any handler."""
    return hours, fee_percent


def require_name(field: str, value: str) -> str:
    name = value.strip()
    if not name:
        raise InvalidArgument(field, f"{field} must not be empty, got {value!r}")
    if len(name) > MAX_NAME:
        raise InvalidArgument(field, f"{field} must be at most {MAX_NAME} characters, got {len(name)}")
    return name


def require_key(field: str, value: str) -> str:
    if not value or not value.strip():
        raise InvalidArgument(field, f"{field} is required")
    if len(value) > MAX_KEY:
        raise InvalidArgument(field, f"{field} must be at most {MAX_KEY} characters, got {len(value)}")
    return value


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) - _NOT_PLACES


def require_time_zone(field: str, value: str) -> str:
    if value not in _zone_names():
        raise InvalidArgument(field, f"{field} must be an IANA time zone like Europe/Istanbul, got {value!r}")
    return value


def require_instant(field: str, value: datetime | None) -> datetime:
    if value is None:
        raise InvalidArgument(field, f"{field} is required (an instant with an offset, e.g. 2026-05-01T09:00:00Z)")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, f"{field} must carry a UTC offset, got {value.isoformat()!r}")
    return value.astimezone(timezone.utc)


def slot_draft(index: int, resource_id: str, start: datetime | None, end: datetime | None,
               currency: str | None, amount_minor: int | None) -> SlotDraft:
    f = f"slots[{index}]"
    rid = parse_uuid(f"{f}.resource_id", resource_id)
    start_utc = require_instant(f"{f}.start_time", start)
    end_utc = require_instant(f"{f}.end_time", end)
    if end_utc <= start_utc:
        raise InvalidArgument(f"{f}.end_time", f"{f}.end_time must be after start_time "
                                               f"({start_utc.isoformat()}), got {end_utc.isoformat()}")
    cur, amount = require_price(f"{f}.price", currency, amount_minor)
    return SlotDraft(index, rid, start_utc, end_utc, amount, cur)


def require_price(field: str, currency: str | None, amount_minor: int | None) -> tuple[str, int]:
    """A price a salon may ask (a slot's or a service's): valid money, at most the bound of its currency."""
    cur, amount = require_money(field, currency, amount_minor)
    top = max_slot_price_minor(cur)
    if amount > top:
        raise InvalidArgument(f"{field}.amount_minor", f"{field}.amount_minor must be at most {top} "
                                                       f"(minor units of {cur}), got {amount}")
    return cur, amount


def check_slot_batch(drafts: list[SlotDraft], now: datetime) -> None:
    """Rules over the whole batch; `now` is the database clock."""
    if not drafts:
        raise InvalidArgument("slots", "slots must hold at least one slot")
    if len(drafts) > MAX_BATCH:
        raise InvalidArgument("slots", f"slots must hold at most {MAX_BATCH} slots per call, got {len(drafts)}")
    seen: dict[tuple, int] = {}
    for d in drafts:
        if d.start_time <= now:
            raise InvalidArgument(f"slots[{d.index}].start_time", f"slots[{d.index}].start_time must be in the "
                                  f"future (now {now.isoformat()}), got {d.start_time.isoformat()}")
        key = (d.resource_id, d.start_time, d.end_time)
        if key in seen:
            raise InvalidArgument(f"slots[{d.index}]", f"slots[{d.index}] repeats slots[{seen[key]}]")
        seen[key] = d.index


def check_window(start: datetime, end: datetime) -> None:
    if end <= start:
        raise InvalidArgument("end_time", f"end_time must be after start_time ({start.isoformat()}), got {end.isoformat()}")
    if end - start > MAX_LIST_WINDOW:
        raise InvalidArgument("end_time", f"the window may span at most {MAX_LIST_WINDOW.days} days, got {end - start}")


def extension_seconds(requested: int, maximum: int) -> int:
    """ExtendHold's length: 0 asks for the maximum (CUTY_HOLD_MAX_EXTENSION_SECONDS)."""
    if requested == 0:
        return maximum
    if not 0 < requested <= maximum:
        raise InvalidArgument("seconds", f"seconds must be between 1 and {maximum} (or 0 for {maximum}), got {requested}")
    return requested


def offer_seconds(requested: int, maximum: int) -> int:
    """HoldSlot's offer_seconds: how long a loser's alternative is held for them (0: not at all),
    never longer than a hold (`maximum`, CUTY_HOLD_TTL_SECONDS): a longer ask gets a hold's length."""
    if requested < 0:
        raise InvalidArgument("offer_seconds", f"offer_seconds must not be negative, got {requested}")
    return min(requested, maximum)


# The longest hold: a payment link's (docs/checkout.md, "Staff book for a customer").
MAX_HOLD_TTL_SECONDS = 86_400


def hold_ttl_seconds(requested: int, default: int) -> int:
    """HoldSlot's ttl_seconds: 0 is a hold's length (`default`); 1..MAX_HOLD_TTL_SECONDS for the
    orchestrator holding a staff-made checkout until its payment link expires."""
    if requested == 0:
        return default
    if requested < 0 or requested > MAX_HOLD_TTL_SECONDS:
        raise InvalidArgument("ttl_seconds", f"ttl_seconds must be 0..{MAX_HOLD_TTL_SECONDS}, got {requested}")
    return requested


# --- who may act ---------------------------------------------------------------------------------

def require_admin(caller: Principal) -> None:
    # A merchant's user without its merchant is UNAUTHENTICATED whatever the RPC, as at the gateway.
    tenancy.merchant_filter(caller)
    caller.require_role(*ADMIN_ROLES)


# Who reads a salon's agenda (customers' ids and payment refs): its merchant's staff and
# admins (the services confine them to their merchant) and the system; not the operator (booking
# keeps no read audit, and every operator read must be audited: docs/tenancy.md).
AGENDA_ROLES = ("staff", "admin", "system")


def require_agenda_reader(caller: Principal) -> None:
    tenancy.merchant_filter(caller)  # a merchant's user without its merchant: UNAUTHENTICATED
    caller.require_role(*AGENDA_ROLES)


# --- wall clocks ---------------------------------------------------------------------------------

def local_time(instant: datetime, tz: str) -> str:
    """RFC 3339 wall time in `tz` with its offset: 2026-03-08T03:00:00-04:00. An instant always
    has exactly one wall time, so this direction is never ambiguous."""
    return instant.astimezone(zoneinfo.ZoneInfo(tz)).isoformat()


def wall_clock_starts(tz: str, day: date, opens: time, closes: time, step: timedelta) -> list[datetime]:
    """UTC instants of the wall times opens, opens+step, ... (before closes) on `day` in `tz`.

    Explicit about DST because the two clocks we use disagree: for a repeated (fall-back) wall
    time zoneinfo's fold=0 is the first, daylight-time instant, while Postgres' `AT TIME ZONE`
    picks the second, standard-time one; for a skipped (spring-forward) wall time both silently
    shift it by the gap. So: a wall time that does not exist is skipped, and one that exists twice
    yields both instants.
    """
    zone = zoneinfo.ZoneInfo(tz)
    out: set[datetime] = set()
    wall, close = datetime.combine(day, opens), datetime.combine(day, closes)
    while wall < close:
        for fold in (0, 1):
            instant = wall.replace(tzinfo=zone, fold=fold).astimezone(timezone.utc)
            if instant.astimezone(zone).replace(tzinfo=None) == wall:  # else: in the gap
                out.add(instant)
        wall += step  # naive arithmetic: wall-clock steps
    return sorted(out)


# --- pages (ListSlots has a row limit) ----------------------------------------------------

@dataclass(frozen=True)
class SlotCursor:
    """The last slot of a page, in the list's order (start_time, resource_id, id)."""
    start_time: datetime
    resource_id: uuid.UUID
    id: uuid.UUID


def page_size(requested: int) -> int:
    return paging.page_size(requested, default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)


# ListSlots' tokens are the same keyset tokens as the agenda's (cutylib.paging), under a query of
# their own, so a ListSlots token is not accepted by the agenda and the other way round.
_SLOTS_QUERY = paging.query_fingerprint("ListSlots")


def encode_page_token(c: SlotCursor) -> str:
    return encode_agenda_token(_SLOTS_QUERY, c)


def decode_page_token(token: str) -> SlotCursor | None:
    """The cursor after which the page starts; None for the first page."""
    return decode_agenda_token(token, _SLOTS_QUERY)


# --- the agenda (ListBookings) -----------------------------------------------------------

def require_day(field: str, value: str) -> date:
    """A calendar day, YYYY-MM-DD (the salon's wall-clock day)."""
    if not value:
        raise InvalidArgument(field, f"{field} is required (YYYY-MM-DD, the salon's local day)")
    try:
        if len(value) != 10:
            raise ValueError
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(field, f"{field} must be a day as YYYY-MM-DD, got {value[:40]!r}") from None


def agenda_query(salon_id: uuid.UUID, day: date, include_held: bool) -> bytes:
    return paging.query_fingerprint("agenda", salon_id, day.isoformat(), include_held)


def encode_agenda_token(query: bytes, c: SlotCursor) -> str:
    return paging.encode_keyset(query, c.start_time, c.resource_id, c.id)


def decode_agenda_token(token: str, query: bytes) -> SlotCursor | None:
    """The agenda entry after which the page starts; None for the first page. A token of another
    query (another salon, day or include_held) is INVALID_ARGUMENT naming `page_token`."""
    key = paging.decode_keyset(token, query, 2)
    return None if key is None else SlotCursor(key[0], key[1][0], key[1][1])
