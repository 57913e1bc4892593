"""Instants on the wire: `google.protobuf.Timestamp` <-> aware UTC `datetime` (docs/architecture.md, "Time").
One conversion for every service, and one way to read an optional Timestamp field of a request."""
from __future__ import annotations

from datetime import datetime, timezone

from google.protobuf.timestamp_pb2 import Timestamp

from .errors import InvalidArgument

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_timestamp(value: datetime | None) -> Timestamp | None:
    """An aware datetime as a Timestamp (None stays None, so an unset field stays unset).

    Straight from the epoch delta: Timestamp.FromDatetime's calendar arithmetic was a visible share
    of HoldSlot's CPU (four timestamps per hold). timedelta keeps seconds and microseconds
    non-negative, as Timestamp wants its nanos."""
    if value is None:
        return None
    d = value - _EPOCH
    return Timestamp(seconds=d.days * 86400 + d.seconds, nanos=d.microseconds * 1000)


def from_timestamp(ts: Timestamp) -> datetime:
    """A Timestamp as an aware UTC datetime."""
    return ts.ToDatetime(tzinfo=timezone.utc)


def optional_instant(msg, name: str, field: str | None = None) -> datetime | None:
    """The Timestamp field `name` of the request `msg` as an aware UTC datetime; None when unset. A
    value no datetime can hold is INVALID_ARGUMENT on `field` (default `name`: the path in the request)."""
    if not msg.HasField(name):
        return None
    try:
        return from_timestamp(getattr(msg, name))
    except (ValueError, OverflowError) as e:
        field = field or name
        raise InvalidArgument(field, f"{field} is not a valid instant: {e}") from None


def window(msg, max_seconds: float) -> tuple[datetime, datetime]:
    """The required time window [start_time, end_time) of the request `msg`: end after start, at
    most `max_seconds` long (a digest answers one bounded window per call); else INVALID_ARGUMENT
    naming the field at fault."""
    start, end = optional_instant(msg, "start_time"), optional_instant(msg, "end_time")
    if start is None:
        raise InvalidArgument("start_time", "start_time is required")
    if end is None:
        raise InvalidArgument("end_time", "end_time is required")
    if end <= start:
        raise InvalidArgument("end_time", "end_time must be after start_time")
    if (end - start).total_seconds() > max_seconds:
        raise InvalidArgument("end_time", f"the window must be at most {max_seconds:g} seconds long")
    return start, end
