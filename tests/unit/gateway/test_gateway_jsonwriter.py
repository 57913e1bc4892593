"""The compiled JSON writer must print exactly what json_format.MessageToDict prints."""
import random

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor as F

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from gateway import jsonwriter


def fill(msg, rng: random.Random, depth: int = 0):
    """Every field set to a random value (repeated ones with 0..3 items), messages recursively."""
    for f in msg.DESCRIPTOR.fields:
        count = rng.randint(0, 3) if f.is_repeated else 1
        for _ in range(count):
            if f.type == F.TYPE_MESSAGE:
                if depth > 3:
                    continue
                sub = getattr(msg, f.name).add() if f.is_repeated else getattr(msg, f.name)
                if f.message_type.full_name == "google.protobuf.Timestamp":
                    sub.seconds = rng.randint(-62135596800, 253402300799)
                    sub.nanos = rng.choice([0, 1, 1000, 1_000_000, 999_999_999, rng.randint(0, 999_999_999)])
                else:
                    fill(sub, rng, depth + 1)
                continue
            if f.type == F.TYPE_ENUM:
                value = rng.choice([v.number for v in f.enum_type.values] + [99])
            elif f.type == F.TYPE_STRING:
                value = rng.choice(["", "x", "Ayşe ✂", '"quoted"\n'])
            elif f.type == F.TYPE_BYTES:
                value = bytes(rng.randrange(256) for _ in range(rng.randint(0, 5)))
            elif f.type == F.TYPE_BOOL:
                value = rng.random() < 0.5
            elif f.type == F.TYPE_DOUBLE:
                value = rng.choice([0.0, 1.5, float("nan"), float("inf"), -1e300])
            else:
                value = rng.choice([0, 1, -1, 2**31 - 1, -(2**31)])
                if f.type in (F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_FIXED32, F.TYPE_FIXED64):
                    value = abs(value)
            if f.is_repeated:
                getattr(msg, f.name).append(value)
            else:
                setattr(msg, f.name, value)
    return msg


def test_same_output_as_json_format_for_every_response_type(routes):
    types = {r.output_type for r in routes.values()} | {booking_pb2.SlotUnavailable, codepool_pb2.OutOfStock}
    rng = random.Random(6)
    for cls in types:
        for _ in range(40):
            msg = fill(cls(), rng)
            assert jsonwriter.to_dict(msg) == _emit_unpopulated(msg), cls.DESCRIPTOR.full_name
        assert jsonwriter.to_dict(cls()) == _emit_unpopulated(cls())


def _emit_unpopulated(msg) -> dict:
    return json_format.MessageToDict(msg, always_print_fields_with_no_presence=True)


def test_zeros_false_and_empty_lists_are_written_and_unset_messages_left_out():
    """As grpc-gateway's EmitUnpopulated, a client reads "0", false and []."""
    from cuty.payments.v1 import checkout_pb2

    assert jsonwriter.to_dict(codepool_pb2.Stock()) == {"productId": "", "available": "0", "reserved": "0",
                                                        "delivered": "0", "quarantined": "0", "revoked": "0"}
    c = jsonwriter.to_dict(checkout_pb2.Checkout(id="c1", state=checkout_pb2.CHECKOUT_STATE_HELD))
    assert c["quantity"] == 0 and c["codes"] == [] and c["failureReason"] == "" and c["holdId"] == ""
    assert "payment" not in c and "amount" not in c  # message fields keep their presence
    assert jsonwriter.to_dict(booking_pb2.ListSlotsResponse()) == {"slots": [], "nextPageToken": ""}


@pytest.mark.parametrize("seconds, nanos", [(0, 0), (1772960400, 123_000_000), (-62135596800, 1), (253402300799, 999_999_999)])
def test_timestamps(seconds, nanos):
    from google.protobuf.timestamp_pb2 import Timestamp
    assert jsonwriter._rfc3339(seconds, nanos) == Timestamp(seconds=seconds, nanos=nanos).ToJsonString()
