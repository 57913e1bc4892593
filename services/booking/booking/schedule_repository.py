"""The SQL of services, working hours, booking settings and availability (docs/booking.md,
"Services and working hours"), next to the code that maps its rows. Free times are computed by
booking_service_times and service slots made by booking_service_slot (migrations/functions/).
Merchant filters as in repository.py: `$n::text IS NULL OR merchant_id = $n` (NULL: any merchant).
"""
from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

from .domain import Salon, Slot
from .repository import Db, _SALON_COLUMNS, salon_from, slot_from
from .schedule import AvailableTime, Interval, Service, ServiceDraft, Settings

_SERVICE_COLUMNS = ("s.id, s.salon_id, s.name, s.duration_minutes, s.price_minor, s.currency, "
                    "s.buffer_before_minutes, s.buffer_after_minutes, s.created_at")
_ABLE = ("ARRAY(SELECT sr.resource_id FROM service_resources sr WHERE sr.merchant_id = s.merchant_id "
         "AND sr.service_id = s.id ORDER BY sr.resource_id) AS resource_ids")

# Nothing when the salon does not exist or is not merchant $10's.
INSERT_SERVICE = f"""
INSERT INTO services AS s (id, merchant_id, salon_id, name, duration_minutes, price_minor, currency,
                           buffer_before_minutes, buffer_after_minutes)
SELECT $1, sa.merchant_id, sa.id, $3, $4, $5, $6, $7, $8 FROM salons sa
 WHERE sa.id = $2 AND ($9::text IS NULL OR sa.merchant_id = $9)
RETURNING {_SERVICE_COLUMNS}, s.merchant_id
"""
# Only resources of the service's salon are inserted; the caller compares what came back.
INSERT_SERVICE_RESOURCES = """
INSERT INTO service_resources (merchant_id, salon_id, service_id, resource_id)
SELECT r.merchant_id, r.salon_id, $3, r.id FROM resources r
 WHERE r.merchant_id = $1 AND r.salon_id = $2 AND r.id = ANY ($4::uuid[])
RETURNING resource_id
"""
GET_SERVICE = f"""
SELECT {_SERVICE_COLUMNS}, s.merchant_id, sa.time_zone, {_ABLE}
  FROM services s JOIN salons sa ON sa.merchant_id = s.merchant_id AND sa.id = s.salon_id
 WHERE s.id = $1 AND ($2::text IS NULL OR s.merchant_id = $2)
"""
# One row with NULL service columns when the salon has none (after the cursor); no row when the
# salon does not exist or is not merchant $5's. Keyset on (created_at, id).
LIST_SERVICES = f"""
SELECT sv.* FROM salons sa
  LEFT JOIN LATERAL (
      SELECT {_SERVICE_COLUMNS}, {_ABLE} FROM services s
       WHERE s.merchant_id = sa.merchant_id AND s.salon_id = sa.id
         AND ($2::timestamptz IS NULL OR (s.created_at, s.id) > ($2, $3::uuid))
       ORDER BY s.created_at, s.id
       LIMIT $4
  ) sv ON true
 WHERE sa.id = $1 AND ($5::text IS NULL OR sa.merchant_id = $5)
"""
# The resource's row is locked (FOR NO KEY UPDATE: holds and services keep referencing it) so two
# replacements of one week run one after the other instead of colliding on the key.
LOCK_RESOURCE = """
SELECT r.merchant_id FROM resources r
 WHERE r.id = $1 AND r.salon_id = $2 AND ($3::text IS NULL OR r.merchant_id = $3)
   FOR NO KEY UPDATE
"""
DELETE_WEEK = "DELETE FROM working_hours WHERE merchant_id = $1 AND resource_id = $2"
INSERT_WEEK = """
INSERT INTO working_hours (merchant_id, salon_id, resource_id, weekday, opens, closes)
SELECT $1, $2, $3, w, o::time, c::time FROM unnest($4::smallint[], $5::text[], $6::text[]) AS i(w, o, c)
"""
# A salon's overrides of one day are replaced under its row's lock (as a resource's week).
LOCK_SALON = """
SELECT sa.merchant_id FROM salons sa WHERE sa.id = $1 AND ($2::text IS NULL OR sa.merchant_id = $2)
   FOR NO KEY UPDATE
"""
RESOURCE_OF_SALON = "SELECT 1 FROM resources WHERE merchant_id = $1 AND salon_id = $2 AND id = $3"
DELETE_OVERRIDE = """
DELETE FROM hours_overrides
 WHERE merchant_id = $1 AND salon_id = $2 AND resource_id IS NOT DISTINCT FROM $3 AND day = $4
"""
INSERT_OVERRIDE = """
INSERT INTO hours_overrides (id, merchant_id, salon_id, resource_id, day, opens, closes)
SELECT gen_random_uuid(), $1, $2, $3, $4, o::time, c::time FROM unnest($5::text[], $6::text[]) AS i(o, c)
"""
SET_SETTINGS = f"""
UPDATE salons SET min_notice_minutes = coalesce($3, min_notice_minutes),
                  booking_horizon_days = coalesce($4, booking_horizon_days),
                  time_step_minutes = coalesce($5, time_step_minutes)
 WHERE id = $1 AND merchant_id = $2
RETURNING {_SALON_COLUMNS}
"""
# The free times of service $1 of salon $2 over the salon's local days $4 .. $5 (midnight to
# midnight in its zone, so a DST day is 23 or 25 hours), after the page's cursor $7 (NULL: from the
# start), at most $6, in one round trip with the service's merchant and zone. One row with NULL
# times when none is free; no row when the service is not the salon's or not merchant $8's.
AVAILABILITY = """
SELECT sa.time_zone, s.duration_minutes, t.start_time, t.resource_ids
  FROM services s JOIN salons sa ON sa.merchant_id = s.merchant_id AND sa.id = s.salon_id
  LEFT JOIN LATERAL (
      SELECT * FROM booking_service_times(s.merchant_id, s.id, $3,
                                          greatest(($4::date)::timestamp AT TIME ZONE sa.time_zone, $7),
                                          ($5::date + 1)::timestamp AT TIME ZONE sa.time_zone)
       LIMIT $6
  ) t ON true
 WHERE s.id = $1 AND s.salon_id = $2 AND ($8::text IS NULL OR s.merchant_id = $8)
"""
SERVICE_SLOT = "SELECT outcome, slot, time_zone FROM booking_service_slot($1, $2, $3, $4, $5)"


def service_from(r: Any) -> Service:
    return Service(r["id"], r["salon_id"], r["name"], r["duration_minutes"], r["price_minor"], r["currency"],
                   r["buffer_before_minutes"], r["buffer_after_minutes"], tuple(r["resource_ids"]), r["created_at"])


class Schedule:
    def __init__(self, db: Db):
        self.db = db

    async def add_service(self, salon_id: uuid.UUID, d: ServiceDraft,
                          merchant_id: str | None) -> tuple[Service | None, list[uuid.UUID]]:
        """(the service, the resource ids that are not the salon's); (None, []) when the salon
        does not exist or is not `merchant_id`'s. In a unit of work: the caller rolls back a miss."""
        r = await self.db.fetchrow(INSERT_SERVICE, uuid.uuid4(), salon_id, d.name, d.duration_minutes, d.price_minor,
                                   d.currency, d.buffer_before_minutes, d.buffer_after_minutes, merchant_id)
        if r is None:
            return None, []
        added = {x["resource_id"] for x in await self.db.fetch(
            INSERT_SERVICE_RESOURCES, r["merchant_id"], salon_id, r["id"], list(d.resource_ids))}
        missing = [i for i in d.resource_ids if i not in added]
        return Service(r["id"], r["salon_id"], r["name"], r["duration_minutes"], r["price_minor"], r["currency"],
                       r["buffer_before_minutes"], r["buffer_after_minutes"], d.resource_ids, r["created_at"]), missing

    async def service(self, service_id: uuid.UUID, merchant_id: str | None) -> tuple[Service, str, str] | None:
        """(the service, its merchant, its salon's time zone), if it is `merchant_id`'s."""
        r = await self.db.fetchrow(GET_SERVICE, service_id, merchant_id)
        return (service_from(r), r["merchant_id"], r["time_zone"]) if r else None

    async def services(self, salon_id: uuid.UUID, after: tuple[datetime, uuid.UUID] | None, limit: int,
                       merchant_id: str | None) -> list[Service] | None:
        rows = await self.db.fetch(LIST_SERVICES, salon_id, after[0] if after else None, after[1] if after else None,
                                   limit, merchant_id)
        if not rows:
            return None
        return [service_from(r) for r in rows if r["id"] is not None]

    async def set_week(self, salon_id: uuid.UUID, resource_id: uuid.UUID, intervals: list[Interval],
                       merchant_id: str | None) -> bool:
        """False when the resource is not the salon's (or not `merchant_id`'s). In a unit of work."""
        merchant = await self.db.fetchval(LOCK_RESOURCE, resource_id, salon_id, merchant_id)
        if merchant is None:
            return False
        await self.db.execute(DELETE_WEEK, merchant, resource_id)
        await self.db.execute(INSERT_WEEK, merchant, salon_id, resource_id, [i.weekday for i in intervals],
                              [i.opens for i in intervals], [i.closes for i in intervals])
        return True

    async def set_override(self, salon_id: uuid.UUID, resource_id: uuid.UUID | None, day: date, closed: bool,
                           intervals: list[Interval], merchant_id: str | None) -> str:
        """'ok', 'salon_not_found' or 'resource_not_found'. In a unit of work."""
        merchant = await self.db.fetchval(LOCK_SALON, salon_id, merchant_id)
        if merchant is None:
            return "salon_not_found"
        if resource_id is not None and await self.db.fetchval(RESOURCE_OF_SALON, merchant, salon_id, resource_id) is None:
            return "resource_not_found"
        await self.db.execute(DELETE_OVERRIDE, merchant, salon_id, resource_id, day)
        if closed:
            await self.db.execute(INSERT_OVERRIDE, merchant, salon_id, resource_id, day, [None], [None])
        elif intervals:
            await self.db.execute(INSERT_OVERRIDE, merchant, salon_id, resource_id, day,
                                  [i.opens for i in intervals], [i.closes for i in intervals])
        return "ok"

    async def set_settings(self, salon_id: uuid.UUID, merchant_id: str, s: Settings) -> Salon | None:
        r = await self.db.fetchrow(SET_SETTINGS, salon_id, merchant_id, s.min_notice_minutes, s.booking_horizon_days,
                                   s.time_step_minutes)
        return salon_from(r) if r else None

    async def availability(self, service_id: uuid.UUID, salon_id: uuid.UUID, resource_id: uuid.UUID | None,
                           start: date, end: date, after: datetime | None, limit: int,
                           merchant_id: str | None) -> tuple[str, int, list[AvailableTime]] | None:
        """(the salon's zone, the service's minutes, free times in order after `after`); None when
        the service is not the salon's or not `merchant_id`'s."""
        rows = await self.db.fetch(AVAILABILITY, service_id, salon_id, resource_id, start, end, limit, after,
                                   merchant_id)
        if not rows:
            return None
        return rows[0]["time_zone"], rows[0]["duration_minutes"], [AvailableTime(r["start_time"], tuple(r["resource_ids"]))
                                      for r in rows if r["start_time"] is not None]

    async def service_slot(self, service_id: uuid.UUID, resource_id: uuid.UUID | None, start: datetime,
                           merchant_id: str | None) -> tuple[str, Slot | None]:
        r = await self.db.fetchrow(SERVICE_SLOT, uuid.uuid4(), merchant_id, service_id, resource_id, start)
        if r["outcome"] != "ok":
            return r["outcome"], None
        return "ok", slot_from(r["slot"], r["time_zone"], True)
