"""The invariant auditor's digest of the code pool (codepool/digest.py): per order delivered in a
window, its codes delivered, revoked and replaced, paged; every code of those orders that went to a
second order; for the orchestrator (payments, `system`) alone, with a bounded window."""
from datetime import datetime, timedelta, timezone

import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb, codepool_pb2_grpc
from cutylib import digests
from cutylib.grpc_errors import bad_field
from cutylib.testing.ids import new_id
from cutylib.testing.trust import channel_as
from cutylib.timestamps import to_timestamp

from codepool_testkit import ADMIN, reserve_request, stocked_product


def window(a: datetime, b: datetime, **kw) -> pb.DigestDeliveriesRequest:
    return pb.DigestDeliveriesRequest(start_time=to_timestamp(a), end_time=to_timestamp(b), **kw)


async def all_pages(stub, a, b, page_size) -> tuple[list, list, int]:
    orders, dups, pages, token = [], [], 0, ""
    while True:
        answer = await stub.DigestDeliveries(window(a, b, page_size=page_size, page_token=token))
        pages += 1
        orders += answer.orders
        dups += answer.duplicates
        token = answer.next_page_token
        if not token:
            return orders, dups, pages


async def test_a_window_of_delivered_orders_in_pages_and_a_code_sold_twice(stub, cp_pool):
    t0 = datetime.now(timezone.utc) - timedelta(seconds=1)
    product_id, _ = await stocked_product(stub, 6)
    delivered = []
    for qty in (1, 2, 1):
        r = await stub.ReserveCodes(reserve_request(product_id, qty))
        await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=r.order_id, payment_transaction_id="pay-" + new_id()))
        delivered.append(r)
    kept = await stub.ReserveCodes(reserve_request(product_id))  # reserved, not delivered: not in the digest
    t1 = datetime.now(timezone.utc) + timedelta(seconds=1)
    orders, dups, pages = await all_pages(stub, t0, t1, 2)
    mine = {o.order_id: o for o in orders if o.product_id == product_id}
    assert set(mine) == {r.order_id for r in delivered} and kept.order_id not in mine
    assert pages >= 2  # 2 a page
    assert [(mine[r.order_id].quantity, mine[r.order_id].delivered, mine[r.order_id].revoked,
             mine[r.order_id].replaced) for r in delivered] == [(1, 1, 0, 0), (2, 2, 0, 0), (1, 1, 0, 0)]
    assert all(mine[r.order_id].payment_transaction_id.startswith("pay-") for r in delivered)
    assert [d for d in dups if d.code_id in {c for r in delivered for c in r.code_ids}] == []

    # Drift, as the table's owner: the first order's code also went to the third order (taken
    # back there, so the unique index on active deliveries does not stop it).
    first, third = delivered[0], delivered[2]
    await cp_pool.execute(
        "INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status, "
        "reserved_at, delivered_at, revoked_at) SELECT merchant_id, $2, order_item_id || '-x', product_id, customer_id, "
        "code_id, 'revoked', reserved_at, delivered_at, clock_timestamp() FROM deliveries WHERE order_id = $1",
        first.order_id, third.order_id)
    orders, dups, _ = await all_pages(stub, t0, t1, 5000)
    (dup,) = [d for d in dups if d.code_id == first.code_ids[0]]
    assert sorted(dup.order_ids) == sorted([first.order_id, third.order_id])
    (o,) = [o for o in orders if o.order_id == third.order_id]
    assert (o.delivered, o.revoked) == (1, 1)


async def test_the_digest_is_the_orchestrators_and_its_window_bounded(cp_server, stub):
    now = datetime.now(timezone.utc)
    addr = f"127.0.0.1:{cp_server.port}"
    ask = window(now - timedelta(hours=1), now)
    async with channel_as("payments", addr, "codepool") as orchestrator, channel_as("gateway", addr, "codepool") as gw:
        ours = codepool_pb2_grpc.CodePoolServiceStub(orchestrator)
        await ours.DigestDeliveries(ask)
        refused = [
            (codepool_pb2_grpc.CodePoolServiceStub(gw).DigestDeliveries(ask), grpc.StatusCode.PERMISSION_DENIED, ""),
            (ours.DigestDeliveries(ask, metadata=ADMIN), grpc.StatusCode.PERMISSION_DENIED, ""),
            (ours.DigestDeliveries(pb.DigestDeliveriesRequest(end_time=to_timestamp(now))),
             grpc.StatusCode.INVALID_ARGUMENT, "start_time"),
            (ours.DigestDeliveries(window(now, now - timedelta(seconds=1))), grpc.StatusCode.INVALID_ARGUMENT,
             "end_time"),
            (ours.DigestDeliveries(window(now - timedelta(days=2), now)), grpc.StatusCode.INVALID_ARGUMENT, "end_time"),
            (ours.DigestDeliveries(window(now - timedelta(hours=1), now, page_size=5001)),
             grpc.StatusCode.INVALID_ARGUMENT, "page_size"),
            (ours.DigestDeliveries(window(now - timedelta(hours=1), now, page_token="bm90IG91cnM")),
             grpc.StatusCode.INVALID_ARGUMENT, "page_token"),
        ]
        for call, code, field in refused:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == code, (code, field)
            if field:
                assert bad_field(e.value) == field


async def test_a_page_token_of_another_window_is_refused(stub):
    now = datetime.now(timezone.utc)
    product_id, _ = await stocked_product(stub, 3)
    for _ in range(3):
        r = await stub.ReserveCodes(reserve_request(product_id))
        await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=r.order_id, payment_transaction_id="p-" + new_id()))
    a, b = now - timedelta(seconds=5), datetime.now(timezone.utc) + timedelta(seconds=1)
    token = (await stub.DigestDeliveries(window(a, b, page_size=1))).next_page_token
    assert token
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.DigestDeliveries(window(a - timedelta(seconds=1), b, page_size=1, page_token=token))
    assert bad_field(e.value) == "page_token"


def summary(a: datetime, b: datetime, count: int) -> pb.SummarizeDeliveriesRequest:
    return pb.SummarizeDeliveriesRequest(start_time=to_timestamp(a), end_time=to_timestamp(b), bucket_count=count)


async def test_the_summary_fingerprints_each_order_and_a_code_sold_twice_moves_its_bucket(stub, cp_pool):
    """Per bucket of the order id's hash: each delivered order fingerprinted from its id, merchant,
    codes counted and codes shared with another order (cutylib.digests), the same facts a completed
    checkout expects (quantity, 0 shared); DigestDeliveries filtered to a bucket pages only its
    orders, with the codes sold twice among them."""
    t0 = datetime.now(timezone.utc) - timedelta(seconds=1)
    product_id, _ = await stocked_product(stub, 3)
    first = await stub.ReserveCodes(reserve_request(product_id, 1))
    other = await stub.ReserveCodes(reserve_request(product_id, 2))
    for r in (first, other):
        await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=r.order_id, payment_transaction_id="pay-" + new_id()))
    t1 = datetime.now(timezone.utc) + timedelta(seconds=1)
    n = digests.MAX_BUCKETS
    got = {x.bucket: x for x in (await stub.SummarizeDeliveries(summary(t0, t1, n))).buckets}
    merchant = (await cp_pool.fetchval("SELECT merchant_id FROM reservations WHERE order_id = $1", first.order_id))
    for r, qty in ((first, 1), (other, 2)):
        x = got[digests.bucket_of(r.order_id, n)]
        if x.count == 1:  # alone in its bucket (other tests' orders share the window)
            assert x.fingerprint == digests.fingerprint_of(r.order_id, merchant, qty, 0)
    # drift: the first order's code delivered to the other order too (taken back there)
    await cp_pool.execute(
        "INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status, "
        "reserved_at, delivered_at, revoked_at) SELECT merchant_id, $2, order_item_id || '-x', product_id, customer_id, "
        "code_id, 'revoked', reserved_at, delivered_at, clock_timestamp() FROM deliveries WHERE order_id = $1",
        first.order_id, other.order_id)
    moved = {x.bucket: x for x in (await stub.SummarizeDeliveries(summary(t0, t1, n))).buckets}
    changed = {b for b in set(got) | set(moved)
               if (got.get(b) and (got[b].count, got[b].fingerprint)) != (moved.get(b) and (moved[b].count,
                                                                                             moved[b].fingerprint))}
    # both orders' buckets: the first shares a code, the other shares one and counts one more
    assert changed == {digests.bucket_of(first.order_id, n), digests.bucket_of(other.order_id, n)}
    b = digests.bucket_of(first.order_id, n)
    page = await stub.DigestDeliveries(window(t0, t1, page_size=5000, bucket_count=n, buckets=[b]))
    assert first.order_id in {o.order_id for o in page.orders}
    assert {digests.bucket_of(o.order_id, n) for o in page.orders} == {b}
    (dup,) = [d for d in page.duplicates if d.code_id == first.code_ids[0]]
    assert sorted(dup.order_ids) == sorted([first.order_id, other.order_id])


async def test_the_summary_is_the_orchestrators_and_its_buckets_bounded(cp_server, stub):
    now = datetime.now(timezone.utc)
    addr = f"127.0.0.1:{cp_server.port}"
    a = now - timedelta(hours=1)
    async with channel_as("payments", addr, "codepool") as orchestrator, channel_as("gateway", addr, "codepool") as gw:
        ours = codepool_pb2_grpc.CodePoolServiceStub(orchestrator)
        await ours.SummarizeDeliveries(summary(a, now, 16))
        refused = [
            (codepool_pb2_grpc.CodePoolServiceStub(gw).SummarizeDeliveries(summary(a, now, 16)),
             grpc.StatusCode.PERMISSION_DENIED, ""),
            (ours.SummarizeDeliveries(summary(a, now, 16), metadata=ADMIN), grpc.StatusCode.PERMISSION_DENIED, ""),
            (ours.SummarizeDeliveries(summary(a, now, 0)), grpc.StatusCode.INVALID_ARGUMENT, "bucket_count"),
            (ours.SummarizeDeliveries(summary(a - timedelta(days=1), now, 16)), grpc.StatusCode.INVALID_ARGUMENT,
             "end_time"),
            (ours.DigestDeliveries(window(a, now, bucket_count=8, buckets=[8])), grpc.StatusCode.INVALID_ARGUMENT,
             "buckets"),
        ]
        for call, code, field in refused:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == code, (code, field)
            if field:
                assert bad_field(e.value) == field
