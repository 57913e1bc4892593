"""Contract changes are checked: the compiled protos against protos/contract-snapshot.json. A
removed or renumbered field, a changed type, a removed enum value, RPC or route fails here;
additions pass. A deliberate break updates the snapshot in the same change
(`python -m cutylib.contract_snapshot --write`)."""
import copy
import json

import pytest
from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from cutylib import contract_snapshot as cs


@pytest.fixture(scope="module")
def fds():
    return descriptor_pb2.FileDescriptorSet.FromString(cs.DESCRIPTORS.read_bytes())


def test_the_contracts_keep_everything_the_snapshot_has():
    found = cs.breaks(json.loads(cs.SNAPSHOT.read_text()), cs.current())
    assert not found, "breaking contract changes (update protos/contract-snapshot.json only on purpose):\n" + \
        "\n".join(found)


def _file(fds, name):
    return next(f for f in fds.file if f.name == name)


def _message(fd, name):
    return next(m for m in fd.message_type if m.name == name)


def _changed(fds, change) -> list[str]:
    before = cs.shape(fds)
    other = copy.deepcopy(fds)
    change(other)
    return cs.breaks(before, cs.shape(other))


def test_each_kind_of_break_is_caught(fds):
    booking = "cuty/booking/v1/booking.proto"
    checkout = "cuty/payments/v1/checkout.proto"

    def remove_field(s):
        m = _message(_file(s, booking), "HoldSlotRequest")
        del m.field[[f.name for f in m.field].index("request_id")]

    def renumber(s):
        next(f for f in _message(_file(s, booking), "Slot").field if f.name == "price").number = 99

    def retype(s):
        f = next(f for f in _message(_file(s, checkout), "Checkout").field if f.name == "quantity")
        f.type = descriptor_pb2.FieldDescriptorProto.TYPE_INT64

    def remove_rpc(s):
        svc = _file(s, checkout).service[0]
        del svc.method[[m.name for m in svc.method].index("PayCheckout")]

    def move_route(s):
        m = next(m for m in _file(s, checkout).service[0].method if m.name == "CancelCheckout")
        m.options.Extensions[annotations_pb2.http].post = "/v1/checkouts/{checkout_id}:abort"

    def remove_enum_value(s):
        e = next(e for e in _file(s, checkout).enum_type if e.name == "CheckoutState")
        del e.value[len(e.value) - 1]

    assert _changed(fds, remove_field) == ["cuty.booking.v1.HoldSlotRequest.request_id (field 3) removed"]
    assert _changed(fds, renumber) == ["cuty.booking.v1.Slot.price renumbered 6 -> 99"]
    assert _changed(fds, retype) == ["cuty.payments.v1.Checkout.quantity changed type int32 -> int64"]
    assert _changed(fds, remove_rpc) == ["rpc cuty.payments.v1.CheckoutService.PayCheckout removed (and its route "
                                         "POST /v1/checkouts/{checkout_id}:pay)"]
    assert _changed(fds, move_route) == ["rpc cuty.payments.v1.CheckoutService.CancelCheckout: route POST "
                                         "/v1/checkouts/{checkout_id}:cancel changed to POST "
                                         "/v1/checkouts/{checkout_id}:abort"]
    assert len(_changed(fds, remove_enum_value)) == 1


def test_additions_are_not_breaks(fds):
    def add(s):
        m = _message(_file(s, "cuty/booking/v1/booking.proto"), "HoldSlotRequest")
        m.field.add(name="note", number=40, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, json_name="note")
        _file(s, "cuty/booking/v1/booking.proto").message_type.add(name="Brand")
    assert _changed(fds, add) == []
