"""Booking's SQL, as named constants next to the code that maps its rows to domain objects.

Repositories take an asyncpg Connection (inside a unit of work) or the Pool itself: a use case that
is one statement needs no BEGIN/COMMIT around it (a statement is its own transaction), and on the
HoldSlot hot path those would triple the round trips.
"""
from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any, Union

import asyncpg

from cutylib.db import sets_its_merchant
from cutylib.errors import AlreadyExists

from .domain import CancellationPolicy, Hold, Resource, Salon, Slot, SlotDraft, effective_status, no_show_fee_minor
from .taken import Blocked

log = logging.getLogger("booking.repository")

Db = Union[asyncpg.Connection, asyncpg.Pool]

# Merchants (docs/tenancy.md, "Booking"): every table carries merchant_id. A query a staff or
# admin user runs takes the merchant as a parameter (`$n::text IS NULL OR ... = $n`, NULL: any
# merchant, for customers, the operator and the system) besides running in a narrowed transaction
# (cutylib.tenancy.scoped, Row-Level Security). Joins between the tables match on merchant_id too,
# so they walk the keys that lead with it.

# --- salons and resources ------------------------------------------------------------------------

_SALON_COLUMNS = ("id, name, time_zone, merchant_id, free_cancellation_hours, cancellation_fee_percent, "
                  "min_notice_minutes, booking_horizon_days, time_step_minutes, no_show_fee_percent")
INSERT_SALON = ("INSERT INTO salons (id, merchant_id, name, time_zone, free_cancellation_hours, "
                f"cancellation_fee_percent, no_show_fee_percent) VALUES ($1, $2, $3, $4, $5, $6, $7) "
                f"RETURNING {_SALON_COLUMNS}")
GET_SALON = (f"SELECT {_SALON_COLUMNS} FROM salons "
             "WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)")
# A policy change, only of the merchant's own salon ($2); a field given as NULL keeps its value.
# Holds copied the policy when they were taken (booking_take_hold), so nothing else changes.
SET_POLICY = (f"UPDATE salons SET free_cancellation_hours = coalesce($3, free_cancellation_hours), "
              f"cancellation_fee_percent = coalesce($4, cancellation_fee_percent), "
              f"no_show_fee_percent = coalesce($5, no_show_fee_percent) "
              f"WHERE id = $1 AND merchant_id = $2 RETURNING {_SALON_COLUMNS}")
# Inserts nothing when the salon does not exist (or is another merchant's), so the caller can
# answer NOT_FOUND. The resource's merchant is the salon's.
INSERT_RESOURCE = """
INSERT INTO resources (id, merchant_id, salon_id, name)
SELECT $1, sa.merchant_id, sa.id, $3 FROM salons sa WHERE sa.id = $2 AND ($4::text IS NULL OR sa.merchant_id = $4)
RETURNING id, salon_id, name
"""


class Salons:
    def __init__(self, db: Db):
        self.db = db

    async def add(self, merchant_id: str, name: str, time_zone: str,
                  policy: CancellationPolicy = CancellationPolicy()) -> Salon:
        r = await self.db.fetchrow(INSERT_SALON, uuid.uuid4(), merchant_id, name, time_zone,
                                   policy.free_cancellation_hours, policy.cancellation_fee_percent,
                                   policy.no_show_fee_percent)
        return salon_from(r)

    async def set_policy(self, salon_id: uuid.UUID, merchant_id: str, hours: int | None,
                         fee_percent: int | None, no_show_fee_percent: int | None = None) -> Salon | None:
        """None when the salon does not exist or is not `merchant_id`'s."""
        r = await self.db.fetchrow(SET_POLICY, salon_id, merchant_id, hours, fee_percent, no_show_fee_percent)
        return salon_from(r) if r else None

    async def get(self, salon_id: uuid.UUID, merchant_id: str | None) -> Salon | None:
        """The salon, if it is `merchant_id`'s (None: any merchant's)."""
        r = await self.db.fetchrow(GET_SALON, salon_id, merchant_id)
        return salon_from(r) if r else None


def salon_from(r: Any) -> Salon:
    return Salon(r["id"], r["name"], r["time_zone"], r["merchant_id"], r["free_cancellation_hours"],
                 r["cancellation_fee_percent"], r["min_notice_minutes"], r["booking_horizon_days"],
                 r["time_step_minutes"], r["no_show_fee_percent"])


class Resources:
    def __init__(self, db: Db):
        self.db = db

    async def add(self, salon_id: uuid.UUID, name: str, merchant_id: str | None) -> Resource | None:
        """None when the salon does not exist or is not `merchant_id`'s (None: any merchant's)."""
        r = await self.db.fetchrow(INSERT_RESOURCE, uuid.uuid4(), salon_id, name, merchant_id)
        return Resource(r["id"], r["salon_id"], r["name"]) if r else None


# --- slots ---------------------------------------------------------------------------------------

# Free = no held-and-unexpired or confirmed hold overlaps it on its resource (database clock), and
# it has not started. The `status IN` term lets the planner use the exclusion constraint's index.
SLOT_AVAILABLE = """(s.start_time > clock_timestamp() AND NOT EXISTS (
    SELECT 1 FROM holds h
     WHERE h.merchant_id = s.merchant_id AND h.resource_id = s.resource_id AND h.status IN ('held', 'confirmed')
       AND h.during && tstzrange(s.start_time, s.end_time)
       AND (h.status = 'confirmed' OR h.expires_at > clock_timestamp())))"""

SLOT_COLUMNS = ("s.id, s.merchant_id, s.salon_id, s.resource_id, s.start_time, s.end_time, s.price_minor, s.currency, "
                "s.service_id")

# Only slots whose resource belongs to the salon ($8 is its merchant) are inserted; the caller
# compares counts. A new slot may overlap a hold of an existing, longer one on its chair, hence
# `available`.
INSERT_SLOTS = f"""
INSERT INTO slots AS s (id, merchant_id, salon_id, resource_id, start_time, end_time, price_minor, currency)
SELECT i.id, r.merchant_id, r.salon_id, r.id, i.start_time, i.end_time, i.price_minor, i.currency
  FROM unnest($2::uuid[], $3::uuid[], $4::timestamptz[], $5::timestamptz[], $6::bigint[], $7::text[])
       AS i(id, resource_id, start_time, end_time, price_minor, currency)
  JOIN resources r ON r.merchant_id = $8 AND r.salon_id = $1 AND r.id = i.resource_id
RETURNING {SLOT_COLUMNS}, {SLOT_AVAILABLE} AS available
"""

# One row per slot; one row with NULL slot columns when the salon exists but has none in range;
# no row at all when the salon does not exist or is not merchant $9's ($9 NULL: any merchant).
LIST_SLOTS = f"""
SELECT sa.time_zone, sa.no_show_fee_percent, sl.*
  FROM salons sa
  LEFT JOIN LATERAL (
      SELECT * FROM (
          SELECT {SLOT_COLUMNS}, {SLOT_AVAILABLE} AS available
            FROM slots s
           WHERE s.merchant_id = sa.merchant_id AND s.salon_id = sa.id AND s.start_time >= $2 AND s.start_time < $3
             -- explicit slots only: service slots are names for computed times (GetAvailability)
             AND s.service_id IS NULL
             -- keyset paging: after the previous page's last slot ($5 NULL: the first page)
             AND ($5::timestamptz IS NULL OR (s.start_time, s.resource_id, s.id) > ($5, $6::uuid, $7::uuid))
      ) x
       WHERE NOT $4 OR x.available
       ORDER BY x.start_time, x.resource_id, x.id
       LIMIT $8
  ) sl ON true
 WHERE sa.id = $1 AND ($9::text IS NULL OR sa.merchant_id = $9)
"""

GET_SLOT = f"""
SELECT sa.time_zone, {SLOT_COLUMNS}, {SLOT_AVAILABLE} AS available, sa.no_show_fee_percent
  FROM slots s JOIN salons sa ON sa.merchant_id = s.merchant_id AND sa.id = s.salon_id
 WHERE s.id = $1 AND ($2::text IS NULL OR s.merchant_id = $2)
"""


def slot_from(r: Any, time_zone: str, available: bool) -> Slot:
    return Slot(r["id"], r["salon_id"], r["resource_id"], r["start_time"], r["end_time"], r["price_minor"],
                r["currency"], time_zone, available, r["service_id"], r.get("merchant_id") or "",
                no_show_fee_minor(r["price_minor"], r.get("no_show_fee_percent") or 0))


class Slots:
    def __init__(self, db: Db):
        self.db = db

    async def add_batch(self, salon: Salon, drafts: list[SlotDraft]) -> dict[uuid.UUID, Slot]:
        """Slots by the draft's id; a draft whose resource is not the salon's is left out."""
        ids = [uuid.uuid4() for _ in drafts]
        try:
            rows = await self.db.fetch(
                INSERT_SLOTS, salon.id, ids, [d.resource_id for d in drafts], [d.start_time for d in drafts],
                [d.end_time for d in drafts], [d.price_minor for d in drafts], [d.currency for d in drafts],
                salon.merchant_id)
        except asyncpg.UniqueViolationError as e:
            # The constraint's own text (key columns and values) is for the log, not the caller.
            log.info("slot exists", extra={"salon_id": str(salon.id), "error": e.detail})
            raise AlreadyExists("a slot with the same resource, start and end exists already",
                                reason="slot-exists") from None
        by_id = {r["id"]: slot_from(r, salon.time_zone, r["available"]) for r in rows}
        return {d.index: by_id[i] for d, i in zip(drafts, ids) if i in by_id}

    async def list(self, salon_id: uuid.UUID, start: datetime, end: datetime, available_only: bool,
                   after=None, limit: int = 500, merchant_id: str | None = None) -> list[Slot] | None:
        """Slots in list order after the cursor `after` (a domain.SlotCursor), at most `limit`;
        None when the salon does not exist or is not `merchant_id`'s (None: any merchant's)."""
        rows = await self.db.fetch(LIST_SLOTS, salon_id, start, end, available_only,
                                   after.start_time if after else None, after.resource_id if after else None,
                                   after.id if after else None, limit, merchant_id)
        if not rows:
            return None
        return [slot_from(r, r["time_zone"], r["available"]) for r in rows if r["id"] is not None]

    async def get(self, slot_id: uuid.UUID, merchant_id: str | None = None) -> Slot | None:
        r = await self.db.fetchrow(GET_SLOT, slot_id, merchant_id)
        return slot_from(r, r["time_zone"], r["available"]) if r else None


# --- holds ---------------------------------------------------------------------------------------

# booking_take_hold and booking_confirm_hold (migrations/functions/) decide in one round trip; each
# sets the merchant ('*') for its own call, so the pool runs them as they are (sets_its_merchant).
TAKE_HOLD = sets_its_merchant("SELECT outcome, hold, alternatives, time_zone, db_now, taken_over, offer "
                              "FROM booking_take_hold($1, $2, $3, $4, $5, $6, $7, $8)")
CONFIRM_HOLD = sets_its_merchant("SELECT outcome, hold, db_now FROM booking_confirm_hold($1, $2, $3)")
# A held hold by its id is said `status IN ('held', 'confirmed') AND status <> 'confirmed'`: then no
# index of held holds alone (holds_customer_held, holds_held_expiry) can serve the statement, only
# the primary key. As `status = 'held'`, statistics taken while few holds were held (a big table is
# analysed seldom) make a whole scan of such an index look free, and the planner takes it over the
# key: every held hold read for one (the growth benchmark's, tests/integration/booking/test_hold_pages.py).
HELD = "status IN ('held', 'confirmed') AND status <> 'confirmed'"
# Only a live hold is released: an expired one stays 'expired' (swept or not), so the answer to
# a release does not depend on whether the sweeper came by first.
RELEASE_HOLD = f"""
UPDATE holds SET status = 'released', updated_at = clock_timestamp()
 WHERE id = $1 AND {HELD} AND expires_at > clock_timestamp()
RETURNING holds AS hold, clock_timestamp() AS db_now
"""
# A booking cancelled after purchase. Only the confirmed hold of that payment; it becomes
# 'released' (out of the no-overlap constraint: the time is bookable again) and remembers when and
# which payment it was confirmed with. Nothing when it is not (the caller then reads why).
CANCEL_BOOKING = """
UPDATE holds SET status = 'released', payment_ref = NULL, cancelled_at = clock_timestamp(),
                 cancelled_payment_ref = payment_ref, updated_at = clock_timestamp()
 WHERE id = $1 AND status = 'confirmed' AND payment_ref = $2
RETURNING holds AS hold, clock_timestamp() AS db_now
"""
# Once (NOT extended), and only while the hold is still live: an expired hold may already be
# someone else's time, so it is never revived by an extension.
EXTEND_HOLD = f"""
UPDATE holds SET expires_at = expires_at + $2::integer * interval '1 second', extended = true,
                 updated_at = clock_timestamp()
 WHERE id = $1 AND {HELD} AND NOT extended AND expires_at > clock_timestamp()
RETURNING holds AS hold, clock_timestamp() AS db_now
"""
# What blocks a slot's time now (booking/taken.py): its resource, who holds the time, and until when
# (NULL: a confirmed booking). The same overlap as holds_no_overlap; no row when nothing blocks it.
BLOCKING = """
SELECT s.resource_id, array_agg(DISTINCT h.customer_id) AS holders,
       CASE WHEN bool_or(h.status = 'confirmed') THEN NULL ELSE max(h.expires_at) END AS until,
       clock_timestamp() AS db_now
  FROM slots s
  JOIN holds h ON h.merchant_id = s.merchant_id AND h.resource_id = s.resource_id
              AND h.status IN ('held', 'confirmed') AND h.during && tstzrange(s.start_time, s.end_time)
              AND (h.status = 'confirmed' OR h.expires_at > clock_timestamp())
 WHERE s.id = $1
 GROUP BY s.resource_id
"""
GET_HOLD = ("SELECT h AS hold, clock_timestamp() AS db_now FROM holds h "
            "WHERE h.id = $1 AND ($2::text IS NULL OR h.merchant_id = $2)")
# A finished hold the retention job moved (migration 0140): read after GET_HOLD found none, so a
# hold moving in between is found in one or the other (the move is one transaction).
GET_MOVED_HOLD = GET_HOLD.replace("FROM holds h", "FROM holds_history h")
# Several sweepers (replicas) at once: SKIP LOCKED hands each a disjoint batch; a row a HoldSlot
# or ConfirmHold is changing right now is skipped and left to that statement. The expired holds are
# found through holds_live (migration 0330: a row per held hold, kept by trigger), whose index holds
# no history.
SWEEP_EXPIRED = f"""
WITH due AS (
    SELECT h.id FROM holds_live l JOIN holds h ON h.id = l.hold_id
       -- statement_timestamp() (stable, the database's clock as the statement began) bounds the
       -- index scan; volatile clock_timestamp() could not, and the scan read every held hold
     WHERE l.expires_at <= statement_timestamp()
       AND {HELD} AND h.expires_at <= statement_timestamp()  -- the hold's own, on the row locked
     ORDER BY l.expires_at
     LIMIT $1
       FOR UPDATE OF h SKIP LOCKED
)
UPDATE holds h SET status = 'expired', updated_at = clock_timestamp()
  FROM due
 WHERE h.id = due.id AND {HELD}  -- each by its key
RETURNING h.id
"""


# A salon's agenda for the local day $2 (midnight to midnight on the salon's wall clock,
# so 23 or 25 hours on a DST day): its confirmed bookings, and with $3 its live holds, in
# (start_time, resource_id, id) order after the cursor ($4..$6), at most $7. One row with NULL
# hold columns when the salon exists but has nothing that day; no row when the salon does not
# exist or is not merchant $8's ($8 NULL: any merchant). A past day's bookings may have moved into
# holds_history (migration 0140): both are read, each through its agenda index, and merged.
_AGENDA_OF = """
      (SELECT h.id, h.slot_id, h.salon_id, h.resource_id, h.customer_id, h.request_id, h.status, h.start_time,
              h.end_time, h.price_minor, h.currency, h.expires_at, h.extended, h.payment_ref, h.created_at,
              h.merchant_id, clock_timestamp() AS db_now
         FROM {table} h
        WHERE h.merchant_id = sa.merchant_id AND h.salon_id = sa.id
          AND h.status IN ('held', 'confirmed')
          AND h.start_time >= ($2::date)::timestamp AT TIME ZONE sa.time_zone
          AND h.start_time < ($2::date + 1)::timestamp AT TIME ZONE sa.time_zone
          AND (h.status = 'confirmed' OR ($3 AND h.expires_at > clock_timestamp()))
          AND ($4::timestamptz IS NULL OR (h.start_time, h.resource_id, h.id) > ($4, $5::uuid, $6::uuid))
        ORDER BY h.start_time, h.resource_id, h.id
        LIMIT $7)"""
LIST_BOOKINGS = f"""
SELECT sa.time_zone, b.*
  FROM salons sa
  LEFT JOIN LATERAL (
      SELECT u.* FROM ({_AGENDA_OF.format(table="holds")}
      UNION ALL{_AGENDA_OF.format(table="holds_history")}
      ) u
       ORDER BY u.start_time, u.resource_id, u.id
       LIMIT $7
  ) b ON true
 WHERE sa.id = $1 AND ($8::text IS NULL OR sa.merchant_id = $8)
"""


def hold_from(r: Any, now: datetime) -> Hold:
    return Hold(r["id"], r["slot_id"], r["salon_id"], r["resource_id"], r["customer_id"], r["request_id"],
                effective_status(r["status"], r["expires_at"], now), r["start_time"], r["end_time"],
                r["price_minor"], r["currency"], r["expires_at"], r["extended"], r["payment_ref"] or "",
                r["created_at"], r["merchant_id"], _or(r, "free_cancellation_hours", 24),
                _or(r, "cancellation_fee_percent", 0), _or(r, "cancelled_payment_ref", "") or "",
                _or(r, "service_id", None), _or(r, "buffer_before_minutes", 0), _or(r, "buffer_after_minutes", 0),
                _or(r, "offered", False))


def _or(r: Any, column: str, default):
    """A column some reads do not select (the agenda's), as its default."""
    try:
        return r[column]
    except KeyError:
        return default


class Holds:
    def __init__(self, db: Db):
        self.db = db

    async def take(self, slot_id: uuid.UUID, customer_id: str, request_id: str, *, ttl_seconds: int,
                   max_active: int, max_alternatives: int,
                   offer_seconds: int = 0) -> tuple[str, Hold | None, list[Slot], int, Hold | None]:
        """(outcome, hold, alternatives, expired holds taken over, the alternative held for a loser):
        see booking_take_hold."""
        r = await self.db.fetchrow(TAKE_HOLD, uuid.uuid4(), slot_id, customer_id, request_id, ttl_seconds,
                                   max_active, max_alternatives, offer_seconds)
        hold = (hold_from(r["hold"], r["db_now"])
                if r["outcome"] in ("held", "existing", "request_reused", "adopted") else None)
        alternatives = [slot_from(s, r["time_zone"], True) for s in r["alternatives"] or ()]
        offer = r["offer"]
        offer = hold_from(offer, r["db_now"]) if offer is not None and offer["id"] is not None else None
        return r["outcome"], hold, alternatives, r["taken_over"] or 0, offer

    async def blocking(self, slot_id: uuid.UUID) -> Blocked | None:
        """What blocks `slot_id`'s time now, or None when nothing does."""
        r = await self.db.fetchrow(BLOCKING, slot_id)
        return Blocked(r["resource_id"], frozenset(r["holders"]), r["until"], r["db_now"]) if r else None

    async def confirm(self, hold_id: uuid.UUID, payment_ref: str, cutoff_seconds: float) -> tuple[str, Hold | None]:
        r = await self.db.fetchrow(CONFIRM_HOLD, hold_id, payment_ref, float(cutoff_seconds))
        return r["outcome"], (hold_from(r["hold"], r["db_now"]) if r["outcome"] != "not_found" else None)

    async def release(self, hold_id: uuid.UUID) -> Hold | None:
        """The released hold, or None when it was not live (or does not exist)."""
        r = await self.db.fetchrow(RELEASE_HOLD, hold_id)
        return hold_from(r["hold"], r["db_now"]) if r else None

    async def cancel_booking(self, hold_id: uuid.UUID, payment_ref: str) -> Hold | None:
        """The cancelled (released) booking, or None when it was not confirmed with `payment_ref`."""
        r = await self.db.fetchrow(CANCEL_BOOKING, hold_id, payment_ref)
        return hold_from(r["hold"], r["db_now"]) if r else None

    async def extend(self, hold_id: uuid.UUID, seconds: int) -> Hold | None:
        """The extended hold, or None when it was not live and unextended (or does not exist)."""
        r = await self.db.fetchrow(EXTEND_HOLD, hold_id, seconds)
        return hold_from(r["hold"], r["db_now"]) if r else None

    async def get(self, hold_id: uuid.UUID, merchant_id: str | None = None) -> Hold | None:
        """The hold, if it is `merchant_id`'s (None: any merchant's)."""
        r = (await self.db.fetchrow(GET_HOLD, hold_id, merchant_id)
             or await self.db.fetchrow(GET_MOVED_HOLD, hold_id, merchant_id))
        return hold_from(r["hold"], r["db_now"]) if r else None

    async def agenda(self, salon_id: uuid.UUID, day, include_held: bool, after=None, limit: int = 500,
                     merchant_id: str | None = None) -> tuple[str, list[Hold]] | None:
        """(the salon's time zone, its holds of the local `day` in agenda order after the cursor
        `after`, a domain.SlotCursor over holds); None when the salon does not exist or is not
        `merchant_id`'s (None: any merchant's)."""
        rows = await self.db.fetch(LIST_BOOKINGS, salon_id, day, include_held,
                                   after.start_time if after else None, after.resource_id if after else None,
                                   after.id if after else None, limit, merchant_id)
        if not rows:
            return None
        return rows[0]["time_zone"], [hold_from(r, r["db_now"]) for r in rows if r["id"] is not None]

    async def sweep(self, batch: int) -> list[uuid.UUID]:
        return [r["id"] for r in await self.db.fetch(SWEEP_EXPIRED, batch)]
