"""ListCheckouts. A customer lists their own checkouts across merchants; staff and
admins their merchant's, filtered by salon, product, state and time; the operator every merchant's,
each page audited. Newest first, keyset pages that walk every checkout once while new ones arrive;
bad filters name their field; a list never shows a client secret or a code."""
from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from checkout_fakes import FAKE_SALON
from cuty.payments.v1 import checkout_pb2 as pb, checkout_pb2_grpc
from cutylib.grpc_errors import bad_field
from cutylib.testing.ids import new_id
from cutylib.testing.trust import TEST_MERCHANT, user
from payments.checkout.domain import validate_create


def merchant() -> str:
    return "merchant-lists-" + uuid.uuid4().hex[:8]


def ts(dt) -> Timestamp:
    t = Timestamp()
    t.FromDatetime(dt)
    return t


async def served(h) -> checkout_pb2_grpc.CheckoutServiceStub:
    return checkout_pb2_grpc.CheckoutServiceStub(await h.serve())


async def book(h, customer: str, *, salon: str | None = None, of: str | None = None) -> pb.Checkout:
    slot = h.booking.add_slot(salon_id=salon, merchant_id=of)
    return await h.service.create(customer, validate_create(slot, "", 0), "")


async def buy_codes(h, customer: str, product: str) -> pb.Checkout:
    return await h.service.create(customer, validate_create("", product, 1), "")


async def walk(stub, md, page_size: int = 0, **filters) -> list[pb.Checkout]:
    out, token = [], ""
    while True:
        got = await stub.ListCheckouts(pb.ListCheckoutsRequest(page_size=page_size, page_token=token, **filters),
                                       metadata=md)
        out += got.checkouts
        token = got.next_page_token
        if not token:
            return out


async def test_a_customer_sees_only_their_own_newest_first_across_merchants(harness):
    h = harness
    stub = await served(h)
    me, someone = "lister-" + new_id(), "other-" + new_id()
    a, b = merchant(), merchant()
    mine = [await book(h, me, of=a),
            await buy_codes(h, me, h.codepool.add_product(merchant_id=b)),
            await book(h, me, of=a)]
    paid = await h.service.pay(me, mine[2].id, "pm_card_3ds", "")  # waits for the buyer: a client secret
    assert paid.payment.client_secret
    theirs = await book(h, someone, of=a)
    got = await walk(stub, user(me, "customer"))
    assert [c.id for c in got] == [c.id for c in reversed(mine)]
    assert {c.merchant_id for c in got} == {a, b}
    assert theirs.id not in {c.id for c in got}
    listed = got[0]
    assert listed.state == pb.CHECKOUT_STATE_AWAITING_ACTION and listed.payment.id == paid.payment.id
    assert listed.payment.status == paid.payment.status
    # never the action or the codes in a list
    assert not listed.payment.client_secret and not listed.payment.HasField("next_action")
    assert all(not c.codes and not c.HasField("diagnostics") for c in got)
    # the booking's salon is recorded with its hold; a code purchase has none
    assert got[2].salon_id == FAKE_SALON and got[1].salon_id == ""
    # a customer's filters narrow their own list only
    assert [c.id for c in await walk(stub, user(me, "customer"), salon_id=FAKE_SALON)] == [mine[2].id, mine[0].id]
    assert [c.id for c in await walk(stub, user(someone, "customer"), salon_id=FAKE_SALON)] == [theirs.id]


async def test_pages_walk_every_checkout_once_while_new_ones_are_created(harness):
    h = harness
    stub = await served(h)
    me = "pager-" + new_id()
    product = h.codepool.add_product(stock=500)
    before = [await buy_codes(h, me, product) for _ in range(13)]
    md = user(me, "customer")
    seen, token, pages = [], "", 0
    created_meanwhile = []
    while True:
        got, new = await asyncio.gather(
            stub.ListCheckouts(pb.ListCheckoutsRequest(page_size=3, page_token=token), metadata=md),
            buy_codes(h, me, product))
        created_meanwhile.append(new.id)
        seen += [c.id for c in got.checkouts]
        pages += 1
        token = got.next_page_token
        if not token:
            break
    assert len(seen) == len(set(seen)), "a checkout was listed twice"
    assert set(c.id for c in before) <= set(seen), "a checkout that existed before the walk was skipped"
    assert pages >= 5
    # newest first throughout: what was listed appears in the order a fresh walk gives it
    fresh = [c.id for c in await walk(stub, md)]
    assert [i for i in fresh if i in set(seen)] == seen
    assert set(fresh) == {c.id for c in before} | set(created_meanwhile)


async def test_staff_filter_their_merchants_checkouts_and_other_merchants_see_none(harness):
    h = harness
    stub = await served(h)
    m = merchant()
    s1, s2 = str(uuid.uuid4()), str(uuid.uuid4())
    product = h.codepool.add_product(merchant_id=m)
    c1 = await book(h, "buyer-" + new_id(), salon=s1, of=m)
    c2 = await book(h, "buyer-" + new_id(), salon=s2, of=m)
    c3 = await buy_codes(h, "buyer-" + new_id(), product)
    cancelled = await book(h, "buyer-" + new_id(), salon=s1, of=m)
    buyer = (await h.row(cancelled.id))["customer_id"]
    assert (await h.service.cancel(buyer, cancelled.id)).state == pb.CHECKOUT_STATE_CANCELLED
    elsewhere = await book(h, "buyer-" + new_id(), salon=s1, of=merchant())  # same salon id, other merchant
    staff = user("st-" + new_id(), "staff", m)

    everything = [c.id for c in await walk(stub, staff)]
    assert everything == [cancelled.id, c3.id, c2.id, c1.id]
    assert [c.id for c in await walk(stub, user("ad-" + new_id(), "admin", m))] == everything
    assert [c.id for c in await walk(stub, staff, salon_id=s1)] == [cancelled.id, c1.id]
    assert [c.id for c in await walk(stub, staff, product_id=product)] == [c3.id]
    assert [c.id for c in await walk(stub, staff, state=pb.CHECKOUT_STATE_CANCELLED)] == [cancelled.id]
    assert [c.id for c in await walk(stub, staff, state=pb.CHECKOUT_STATE_HELD, salon_id=s1)] == [c1.id]
    # time: created_after <= created < created_before
    t2, t3 = (await h.row(c2.id))["created_at"], (await h.row(c3.id))["created_at"]
    assert [c.id for c in await walk(stub, staff, created_after=ts(t2), created_before=ts(t3))] == [c2.id]
    assert [c.id for c in await walk(stub, staff, created_after=ts(t3))] == [cancelled.id, c3.id]
    assert [c.id for c in await walk(stub, staff, created_before=ts(t2 + timedelta(microseconds=1)))] == [c2.id, c1.id]
    # small pages give the same list
    assert [c.id for c in await walk(stub, staff, page_size=1)] == everything
    # another merchant's staff and admins: an empty list, not an error
    for role in ("staff", "admin"):
        other = user("x-" + new_id(), role, merchant())
        assert await walk(stub, other) == []
        assert elsewhere.id not in {c.id for c in await walk(stub, other, salon_id=s1)}
    # staff see the checkouts, never a buyer's secret
    assert all(not c.payment.client_secret and not c.codes for c in await walk(stub, staff))


async def test_the_operator_lists_every_merchant_and_each_page_is_audited(harness):
    h = harness
    stub = await served(h)
    a, b = merchant(), merchant()
    salon = str(uuid.uuid4())
    made = [await book(h, "buyer-" + new_id(), salon=salon, of=a), await book(h, "buyer-" + new_id(), salon=salon, of=b)]
    op = "op-" + new_id()
    got = await walk(stub, user(op, "operator"), page_size=1, salon_id=salon)
    assert [c.id for c in got] == [made[1].id, made[0].id]
    audited = await h.pool.fetch("SELECT rpc, object_id FROM operator_reads WHERE subject = $1 ORDER BY id", op)
    assert [r["rpc"] for r in audited] == ["ListCheckouts"] * 2  # one per page
    assert [r["object_id"] for r in audited] == [made[1].id, made[0].id]
    # staff reads are the merchant's own business
    await walk(stub, user("st-" + new_id(), "staff", a))
    assert await h.pool.fetchval("SELECT count(*) FROM operator_reads WHERE rpc = 'ListCheckouts' "
                                 "AND subject LIKE 'st-%'") == 0


@pytest.mark.parametrize("request_,field", [
    (dict(state=99), "state"),
    (dict(salon_id="not-a-uuid"), "salon_id"),
    (dict(product_id="nope"), "product_id"),
    (dict(page_size=-1), "page_size"),
    (dict(page_token="not-a-token"), "page_token"),
    (dict(created_after=ts(__import__("datetime").datetime(2026, 2, 1)),
          created_before=ts(__import__("datetime").datetime(2026, 1, 1))), "created_before"),
    (dict(created_after=ts(__import__("datetime").datetime(2026, 1, 1)),
          created_before=ts(__import__("datetime").datetime(2026, 1, 1))), "created_before"),
])
async def test_bad_filters_name_the_field(harness, request_, field):
    stub = await served(harness)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ListCheckouts(pb.ListCheckoutsRequest(**request_), metadata=user("st", "staff"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == field, e.value.details()


async def test_a_token_belongs_to_its_query_and_its_caller(harness):
    h = harness
    stub = await served(h)
    me = "tok-" + new_id()
    for _ in range(3):
        await book(h, me)
    md = user(me, "customer")
    first = await stub.ListCheckouts(pb.ListCheckoutsRequest(page_size=1), metadata=md)
    assert first.next_page_token
    for req, who in ((dict(state=pb.CHECKOUT_STATE_HELD), md), (dict(salon_id=FAKE_SALON), md),
                     ({}, user("someone-" + new_id(), "customer")), ({}, user("st", "staff"))):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.ListCheckouts(pb.ListCheckoutsRequest(page_size=1, page_token=first.next_page_token, **req),
                                     metadata=who)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == "page_token", req
    # the same query goes on
    second = await stub.ListCheckouts(pb.ListCheckoutsRequest(page_size=1, page_token=first.next_page_token),
                                      metadata=md)
    assert second.checkouts[0].id != first.checkouts[0].id


async def test_staff_without_a_merchant_are_unauthenticated(harness):
    stub = await served(harness)
    for role in ("staff", "admin"):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.ListCheckouts(pb.ListCheckoutsRequest(), metadata=user("x", role, ""))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_the_checkout_records_the_salon_with_the_hold(harness):
    h = harness
    salon = str(uuid.uuid4())
    created = await book(h, "salon-" + new_id(), salon=salon)
    row = await h.row(created.id)
    assert str(row["salon_id"]) == salon and row["merchant_id"] == TEST_MERCHANT
    assert created.salon_id == salon
