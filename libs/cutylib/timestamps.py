"""Instants on the wire: `google.protobuf.Timestamp` <-> aware UTC `datetime` (docs/architecture.md, "Time").
One conversion for every service (issue 11: four `_ts` before)."""
from __future__ import annotations

from datetime import datetime, timezone

from google.protobuf.timestamp_pb2 import Timestamp

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
