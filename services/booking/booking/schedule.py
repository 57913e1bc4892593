"""Services and working hours: the pure rules (docs/booking.md, "Services and working hours").

What a valid service, weekly interval, date override, booking setting and availability query is.
No I/O. Which times are free is computed by the database (booking_service_times), and whether a
time can be held is decided there too (booking_take_service_hold); these rules only refuse input
before it gets there, naming the field at fault.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from cutylib import paging
from cutylib.errors import InvalidArgument
from cutylib.fields import parse_uuid

from .domain import require_day, require_name, require_price

# The requests' ranges, lengths, counts and wall-time shapes are their contracts' annotations
# (protos/cuty/booking/v1/booking.proto), checked by the server before a handler runs; what is
# here is what an annotation cannot say.
MAX_AVAILABILITY_DAYS = 31
DEFAULT_TIMES_PAGE, MAX_TIMES_PAGE = 500, 2000
# How long a race loser's alternative is held for them (the offer), by the checkout's HoldSlot.
OFFER_SECONDS = 60



@dataclass(frozen=True)
class Service:
    id: uuid.UUID
    salon_id: uuid.UUID
    name: str
    duration_minutes: int
    price_minor: int
    currency: str
    buffer_before_minutes: int
    buffer_after_minutes: int
    resource_ids: tuple[uuid.UUID, ...]
    created_at: datetime | None = None


@dataclass(frozen=True)
class ServiceDraft:
    name: str
    duration_minutes: int
    price_minor: int
    currency: str
    buffer_before_minutes: int
    buffer_after_minutes: int
    resource_ids: tuple[uuid.UUID, ...]


@dataclass(frozen=True)
class Interval:
    """A wall-clock interval, "HH:MM" each; closes <= opens closes the next day, "24:00" is midnight."""
    opens: str
    closes: str
    weekday: int = 0  # ISO 1..7 for weekly hours; 0 for a day's override


@dataclass(frozen=True)
class Settings:
    min_notice_minutes: int | None
    booking_horizon_days: int | None
    time_step_minutes: int | None


@dataclass(frozen=True)
class AvailableTime:
    start_time: datetime
    resource_ids: tuple[uuid.UUID, ...]


def service_draft(name: str, duration: int, currency: str | None, amount_minor: int | None, buffer_before: int,
                  buffer_after: int, resource_ids: list[str]) -> ServiceDraft:
    name = require_name("name", name)
    cur, amount = require_price("price", currency, amount_minor)
    ids = tuple(parse_uuid(f"resource_ids[{i}]", r) for i, r in enumerate(resource_ids))
    if len(set(ids)) != len(ids):  # the same UUID spelt in another case passes the annotation's `unique`
        raise InvalidArgument("resource_ids", "resource_ids names a resource twice")
    return ServiceDraft(name, duration, amount, cur, buffer_before, buffer_after, ids)


def interval(field: str, opens: str, closes: str, weekday: int = 0) -> Interval:
    o, c = opens, closes  # wall times HH:MM (closes may be 24:00), by their annotations
    if o == c:  # nothing or a whole day? A whole day is 00:00-24:00.
        raise InvalidArgument(f"{field}.closes", f"{field}.closes must differ from opens ({o})")
    return Interval(o, c, weekday)


def weekly_hours(intervals: list[tuple[int, str, str]]) -> list[Interval]:
    out, seen = [], set()
    for i, (weekday, opens, closes) in enumerate(intervals):
        iv = interval(f"intervals[{i}]", opens, closes, weekday)
        if (weekday, iv.opens) in seen:
            raise InvalidArgument(f"intervals[{i}]", f"intervals[{i}] opens at the same time as another of weekday "
                                                     f"{weekday}")
        seen.add((weekday, iv.opens))
        out.append(iv)
    return out


def day_override(day: str, closed: bool, intervals: list[tuple[str, str]]) -> tuple[date, bool, list[Interval]]:
    d = require_day("day", day)
    if closed and intervals:
        raise InvalidArgument("intervals", "a closed day has no intervals; give closed or intervals, not both")
    ivs = [interval(f"intervals[{i}]", o, c) for i, (o, c) in enumerate(intervals)]
    if len({iv.opens for iv in ivs}) != len(ivs):
        raise InvalidArgument("intervals", "two intervals open at the same time")
    return d, closed, ivs


def settings_change(notice: int | None, horizon: int | None, step: int | None) -> Settings:
    """A change of a salon's booking settings (None: kept); at least one given and each in its range,
    by the request's annotations."""
    return Settings(notice, horizon, step)


def day_range(start_day: str, end_day: str) -> tuple[date, date]:
    start = require_day("start_day", start_day)
    end = require_day("end_day", end_day) if end_day else start
    if end < start:
        raise InvalidArgument("end_day", f"end_day must not be before start_day ({start}), got {end}")
    if end - start >= timedelta(days=MAX_AVAILABILITY_DAYS):
        raise InvalidArgument("end_day", f"the range may span at most {MAX_AVAILABILITY_DAYS} days, "
                                         f"got {(end - start).days + 1}")
    return start, end


def times_page_size(requested: int) -> int:
    return paging.page_size(requested, default=DEFAULT_TIMES_PAGE, maximum=MAX_TIMES_PAGE)


def availability_query(service_id: uuid.UUID, start: date, end: date, resource_id: uuid.UUID | None) -> bytes:
    return paging.query_fingerprint("availability", service_id, start.isoformat(), end.isoformat(), resource_id or "")


def encode_times_token(query: bytes, last: datetime) -> str:
    return paging.encode_keyset(query, last)


def decode_times_token(token: str, query: bytes) -> datetime | None:
    key = paging.decode_keyset(token, query, 0)
    return None if key is None else key[0]


def services_query(salon_id: uuid.UUID) -> bytes:
    return paging.query_fingerprint("ListServices", salon_id)


def encode_services_token(query: bytes, created_at: datetime, service_id: uuid.UUID) -> str:
    return paging.encode_keyset(query, created_at, service_id)


def decode_services_token(token: str, query: bytes) -> tuple[datetime, uuid.UUID] | None:
    key = paging.decode_keyset(token, query, 1)
    return None if key is None else (key[0], key[1][0])
