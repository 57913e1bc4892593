"""The invariant auditor's digest of booking (booking/digest.py): the holds created in a window
that were confirmed (bookings, and those cancelled after purchase) with what confirmed them, paged;
for the orchestrator (payments, `system`) alone, with a bounded window."""
from datetime import datetime, timedelta, timezone

import asyncpg
import grpc
import pytest

from booking_harness import tomorrow
from cuty.booking.v1 import booking_pb2 as pb, booking_pb2_grpc
from booking import digest
from cutylib import digests
from cutylib.grpc_errors import bad_field
from cutylib.testing.trust import channel_as
from cutylib.timestamps import to_timestamp


def window(a: datetime, b: datetime, **kw) -> pb.DigestHoldsRequest:
    return pb.DigestHoldsRequest(start_time=to_timestamp(a), end_time=to_timestamp(b), **kw)


async def test_confirmed_holds_of_a_window_in_pages(booking):
    t0 = datetime.now(timezone.utc) - timedelta(seconds=1)
    salon, (r1,) = await booking.salon()
    slots = (await booking.day(salon, [r1], tomorrow(9), count=5))[r1]
    holds = [await booking.hold(s.id) for s in slots]
    for i, h in enumerate(holds[:3]):
        await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=h.id, payment_ref=f"pay-{i}"))
    await booking.stub.CancelBooking(pb.CancelBookingRequest(hold_id=holds[2].id, payment_ref="pay-2"))
    await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=holds[3].id))  # never confirmed: not listed
    t1 = datetime.now(timezone.utc) + timedelta(seconds=1)
    seen, token, pages = [], "", 0
    while True:
        answer = await booking.stub.DigestHolds(window(t0, t1, page_size=1, page_token=token))
        seen += answer.holds
        pages += 1
        token = answer.next_page_token
        if not token:
            break
    mine = {h.hold_id: h for h in seen if h.hold_id in {x.id for x in holds}}
    assert set(mine) == {h.id for h in holds[:3]} and pages >= 3
    assert [(mine[h.id].status, mine[h.id].payment_ref, mine[h.id].cancelled) for h in holds[:3]] == [
        (pb.HOLD_STATUS_CONFIRMED, "pay-0", False), (pb.HOLD_STATUS_CONFIRMED, "pay-1", False),
        (pb.HOLD_STATUS_RELEASED, "pay-2", True)]
    assert all(mine[h.id].price.amount_minor == h.price.amount_minor for h in holds[:3])
    times = [h.create_time.ToDatetime() for h in seen]
    assert times == sorted(times)


async def test_the_digest_is_the_orchestrators_and_its_window_bounded(booking):
    now = datetime.now(timezone.utc)
    addr = f"127.0.0.1:{booking.server.port}"
    ask = window(now - timedelta(hours=1), now)
    async with channel_as("payments", addr, "booking") as orchestrator, channel_as("gateway", addr, "booking") as gw:
        ours = booking_pb2_grpc.BookingServiceStub(orchestrator)
        await ours.DigestHolds(ask)
        refused = [
            (booking_pb2_grpc.BookingServiceStub(gw).DigestHolds(ask), grpc.StatusCode.PERMISSION_DENIED, ""),
            (ours.DigestHolds(pb.DigestHoldsRequest(start_time=to_timestamp(now))),
             grpc.StatusCode.INVALID_ARGUMENT, "end_time"),
            (ours.DigestHolds(window(now, now)), grpc.StatusCode.INVALID_ARGUMENT, "end_time"),
            (ours.DigestHolds(window(now - timedelta(days=1, seconds=1), now)), grpc.StatusCode.INVALID_ARGUMENT,
             "end_time"),
            (ours.DigestHolds(window(now - timedelta(hours=1), now, page_size=-1)), grpc.StatusCode.INVALID_ARGUMENT,
             "page_size"),
        ]
        for call, code, field in refused:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == code, (code, field)
            if field:
                assert bad_field(e.value) == field


def summary(a: datetime, b: datetime, count: int) -> pb.SummarizeHoldsRequest:
    return pb.SummarizeHoldsRequest(start_time=to_timestamp(a), end_time=to_timestamp(b), bucket_count=count)


async def test_the_summary_fingerprints_confirmed_holds_per_bucket_and_pages_one_bucket(booking, booking_dsn):
    """Per bucket of the hold id's hash: the confirmed holds not cancelled, each fingerprinted from
    its id, payment_ref and merchant (cutylib.digests); DigestHolds filtered to a bucket pages only
    its holds."""
    t0 = datetime.now(timezone.utc) - timedelta(seconds=1)
    salon, (r1,) = await booking.salon()
    slots = (await booking.day(salon, [r1], tomorrow(10), count=4))[r1]
    holds = [await booking.hold(s.id) for s in slots]
    for i, h in enumerate(holds[:3]):
        await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=h.id, payment_ref=f"pay-{i}"))
    await booking.stub.CancelBooking(pb.CancelBookingRequest(hold_id=holds[2].id, payment_ref="pay-2"))
    t1 = datetime.now(timezone.utc) + timedelta(seconds=1)
    n = digests.MAX_BUCKETS
    got = {x.bucket: x for x in (await booking.stub.SummarizeHolds(summary(t0, t1, n))).buckets}
    merchant = (await booking.stub.DigestHolds(window(t0, t1, page_size=5000))).holds[0].merchant_id
    for i, h in enumerate(holds[:2]):  # confirmed: in its bucket with its facts' fingerprint
        x = got[digests.bucket_of(h.id, n)]
        assert x.count >= 1
        if x.count == 1:  # alone in its bucket (other tests' holds share the window)
            assert x.fingerprint == digests.fingerprint_of(h.id, f"pay-{i}", merchant)
    for h in holds[2:]:  # cancelled after purchase, never confirmed: not summarised
        x = got.get(digests.bucket_of(h.id, n))
        assert x is None or x.count >= 1 and x.fingerprint != digests.fingerprint_of(h.id, "pay-2", merchant)
    # drifted (payment_ref changed behind booking's back): the bucket's fingerprint moves
    b0 = digests.bucket_of(holds[0].id, n)
    page = await booking.stub.DigestHolds(window(t0, t1, page_size=5000, bucket_count=n, buckets=[b0]))
    assert holds[0].id in {h.hold_id for h in page.holds}
    assert {digests.bucket_of(h.hold_id, n) for h in page.holds} == {b0}
    owner = await asyncpg.connect(booking_dsn)  # drift as the table's owner
    try:
        await owner.execute("UPDATE holds SET payment_ref = 'pay-other' WHERE id = $1::uuid", holds[0].id)
    finally:
        await owner.close()
    moved = {x.bucket: x for x in (await booking.stub.SummarizeHolds(summary(t0, t1, n))).buckets}
    assert (moved[b0].count, moved[b0].fingerprint) != (got[b0].count, got[b0].fingerprint)
    assert {b: (x.count, x.fingerprint) for b, x in moved.items() if b != b0} == {
        b: (x.count, x.fingerprint) for b, x in got.items() if b != b0}


async def test_the_summary_is_the_orchestrators_and_its_buckets_bounded(booking):
    now = datetime.now(timezone.utc)
    addr = f"127.0.0.1:{booking.server.port}"
    a = now - timedelta(hours=1)
    async with channel_as("payments", addr, "booking") as orchestrator, channel_as("gateway", addr, "booking") as gw:
        ours = booking_pb2_grpc.BookingServiceStub(orchestrator)
        await ours.SummarizeHolds(summary(a, now, 16))
        refused = [
            (booking_pb2_grpc.BookingServiceStub(gw).SummarizeHolds(summary(a, now, 16)),
             grpc.StatusCode.PERMISSION_DENIED, ""),
            (ours.SummarizeHolds(summary(a, now, 0)), grpc.StatusCode.INVALID_ARGUMENT, "bucket_count"),
            (ours.SummarizeHolds(summary(a, now, 65537)), grpc.StatusCode.INVALID_ARGUMENT, "bucket_count"),
            (ours.SummarizeHolds(summary(now, a, 16)), grpc.StatusCode.INVALID_ARGUMENT, "end_time"),
            (ours.DigestHolds(window(a, now, bucket_count=16, buckets=[16])), grpc.StatusCode.INVALID_ARGUMENT,
             "buckets"),
            (ours.DigestHolds(window(a, now, buckets=[1])), grpc.StatusCode.INVALID_ARGUMENT, "bucket_count"),
            (ours.DigestHolds(window(a, now, bucket_count=16)), grpc.StatusCode.INVALID_ARGUMENT, "buckets"),
        ]
        for call, code, field in refused:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == code, (code, field)
            if field:
                assert bad_field(e.value) == field


async def test_the_summary_reads_its_window_from_the_covering_index_alone(booking_dsn):
    """SUMMARY over a window of 200 among 20,000 confirmed holds: an index-only scan of holds_summary
    (migration 0260) that reads the window's entries, no heap page per hold (EXPLAIN ANALYZE on a
    real table, rolled back)."""
    import json

    conn = await asyncpg.connect(booking_dsn)
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute("SET LOCAL session_replication_role = replica")  # no foreign keys: rows alone
        await conn.execute(
            "INSERT INTO holds (id, slot_id, salon_id, resource_id, customer_id, request_id, status, start_time, "
            "end_time, price_minor, currency, expires_at, payment_ref, created_at, updated_at, merchant_id) "
            "SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'c-' || i, 'r-' || i, "
            "'confirmed', t, t + interval '1 hour', 100, 'TRY', t, 'pay-' || i, "
            "timestamptz '2020-01-01' + make_interval(secs => i), timestamptz '2020-01-01', 'm-' || (i % 7) "
            "FROM generate_series(1, 20000) i, LATERAL (SELECT timestamptz '2030-01-01' + make_interval(hours => i)) x(t)")
        await conn.execute("ANALYZE holds")
        a = datetime(2020, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=5000)
        (doc,) = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {digest.SUMMARY}", a,
                                                a + timedelta(seconds=200), 64))
        nodes, stack = [], [doc["Plan"]]
        while stack:
            n = stack.pop()
            nodes.append(n)
            stack += n.get("Plans", [])
        (scan,) = [n for n in nodes if n.get("Relation Name") == "holds"]
        assert (scan["Node Type"], scan.get("Index Name")) == ("Index Only Scan", "holds_summary"), scan
        assert scan["Actual Rows"] == 200
    finally:
        await tx.rollback()
        await conn.close()
