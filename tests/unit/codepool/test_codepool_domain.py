"""Pure rules: validation naming the field, masking, page tokens, ids."""
import time
import uuid

import pytest

from cuty.codepool.v1 import codepool_pb2
from cutylib import validation
from cutylib.errors import InvalidArgument
from cutylib.fields import parse_uuid
from cutylib.money import require_money
from codepool import domain


@pytest.mark.parametrize("q", [0, -1, 101, 10**6])
def test_quantity_outside_1_to_100(q):
    """The contract's rule (codepool.proto), checked by the server before ReserveCodes runs."""
    request = codepool_pb2.ReserveCodesRequest(order_id="o", order_item_id="i", product_id=str(uuid.uuid4()), quantity=q)
    assert [f for f, _ in validation.violations(request)] == ["quantity"]


def test_quantity_bounds_accepted():
    for q in (1, 100):
        request = codepool_pb2.ReserveCodesRequest(order_id="o", order_item_id="i", product_id=str(uuid.uuid4()), quantity=q)
        assert validation.violations(request) == []


@pytest.mark.parametrize("value, problem", [
    ("", "is empty"), ("   ", "is empty"), ("SECRET" * 50, "longer than 256"), (" SECRET", "whitespace"),
    ("SEC\tRET", "control character"), ("SECRET\x00", "control character"),
])
def test_bad_codes_are_named_by_index_and_never_echoed(value, problem):
    with pytest.raises(InvalidArgument) as e:
        domain.require_codes(["ok-1", value], offset=40)
    assert e.value.field == "codes[41]" and problem in e.value.message
    assert "SEC" not in e.value.message


def test_256_characters_and_unicode_are_fine():
    domain.require_codes(["x" * 256, "ÇĞİÖŞÜ-1234"])


def test_mask_shows_at_most_last_4_and_at_most_half():
    assert domain.mask("ABCD-EFGH-1234") == "****1234"
    assert domain.mask("12345") == "****45"
    assert domain.mask("1") == "****"


def test_page_token_round_trip_and_garbage():
    some = uuid.uuid4()
    assert domain.decode_page_token(domain.encode_page_token(some)) == some
    assert domain.decode_page_token("") == uuid.UUID(int=0)
    for bad in ("garbage!", "AAAA", domain.encode_page_token(some)[:-2]):
        with pytest.raises(InvalidArgument) as e:
            domain.decode_page_token(bad)
        assert e.value.field == "page_token"


def test_code_ids_are_v7_unique_and_time_ordered(monkeypatch):
    a = domain.new_code_ids(1000)
    assert len(set(a)) == 1000 and all(u.version == 7 and u.variant == uuid.RFC_4122 for u in a)
    now = time.time_ns()
    monkeypatch.setattr(domain.time, "time_ns", lambda: now + 2_000_000)  # two milliseconds later
    b = domain.new_code_ids(1)
    assert max(a) < b[0]


def test_uuid_and_ids():
    with pytest.raises(InvalidArgument) as e:
        parse_uuid("product_id", "nope")
    assert e.value.field == "product_id"
    with pytest.raises(InvalidArgument):
        domain.require_id("order_id", "x" * 129)
    with pytest.raises(InvalidArgument):
        domain.require_id("order_id", "a\nb")


def test_transition_tables():
    assert domain.can_transition(domain.CODE_TRANSITIONS, "reserved", "available")
    assert not domain.can_transition(domain.CODE_TRANSITIONS, "delivered", "available")
    assert not domain.can_transition(domain.CODE_TRANSITIONS, "available", "delivered")
    assert not any(old == "delivered" for old, _ in domain.RESERVATION_TRANSITIONS)


def test_price_and_sku():
    assert require_money("price", "TRY", 0) == ("TRY", 0)
    for cur, amount, field in (("try", 1, "price.currency_code"), ("", 1, "price.currency_code"),
                               ("TRY", -1, "price.amount_minor")):
        with pytest.raises(InvalidArgument) as e:
            require_money("price", cur, amount)
        assert e.value.field == field
    bad_sku = codepool_pb2.CreateProductRequest(sku="has space", name="n", price={"currency_code": "EUR"})
    assert [f for f, _ in validation.violations(bad_sku)] == ["sku"]
