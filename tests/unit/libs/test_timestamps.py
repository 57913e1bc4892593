"""cutylib.timestamps: the one reading of an optional Timestamp field of a request."""
from datetime import datetime, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from cuty.payments.v1 import checkout_pb2
from cutylib.errors import InvalidArgument
from cutylib.timestamps import optional_instant, to_timestamp


def test_an_optional_instant_is_none_when_unset_and_utc_when_set():
    at = datetime(2026, 5, 1, 9, 0, tzinfo=timezone.utc)
    assert optional_instant(checkout_pb2.ListCheckoutsRequest(), "created_after") is None
    request = checkout_pb2.ListCheckoutsRequest(created_after=to_timestamp(at))
    assert optional_instant(request, "created_after") == at


def test_an_instant_no_datetime_holds_names_its_field():
    request = checkout_pb2.ListCheckoutsRequest(created_after=Timestamp(seconds=10**13))
    with pytest.raises(InvalidArgument) as e:
        optional_instant(request, "created_after")
    assert e.value.field == "created_after"
    with pytest.raises(InvalidArgument) as e:
        optional_instant(request, "created_after", "filter.created_after")
    assert e.value.field == "filter.created_after"
