"""The invariant auditor's rounds on the payments database (payments/audit.py): one replica at a
time (the lease), every window after the watermark audited once and in order, and a replica whose
lease was taken over cannot move the watermark back. The other services' digests and the PSP are
stand-ins answering empty windows (their own tests cover them); each call is counted."""
import asyncio
import dataclasses
import time
from datetime import timedelta

import grpc
import pytest_asyncio

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cutylib.psp import PspError
from cutylib.timestamps import from_timestamp
from payments.audit import LEASE, WATERMARK, AuditSettings, Auditor


class EmptyWorld:
    """Booking, the code pool and the PSP with nothing in any window; remembers the windows asked
    (booking's summary, asked once per window) and counts the row-by-row digest pages asked."""

    def __init__(self, takes: float = 0.01):
        self.windows: list[tuple] = []
        self.asked_at: list[float] = []  # time.monotonic() of each SummarizeHolds
        self.takes = takes
        self.pages = 0  # DigestHolds and DigestDeliveries calls

    async def SummarizeHolds(self, request, timeout=None):
        self.windows.append((from_timestamp(request.start_time), from_timestamp(request.end_time)))
        self.asked_at.append(time.monotonic())
        await asyncio.sleep(self.takes)
        return booking_pb2.SummarizeHoldsResponse()

    async def SummarizeDeliveries(self, request, timeout=None):
        return codepool_pb2.SummarizeDeliveriesResponse()

    async def DigestHolds(self, request, timeout=None):
        self.pages += 1
        return booking_pb2.DigestHoldsResponse()

    async def DigestDeliveries(self, request, timeout=None):
        self.pages += 1
        return codepool_pb2.DigestDeliveriesResponse()

    async def list_charges(self, gte, lt, **kw):
        return {"data": [], "has_more": False}

    list_refunds = list_charges

    async def balance_report(self, gte, lt, bucket_count):
        return {"object": "balance_report", "bucket_count": bucket_count, "count": 0, "buckets": []}


SETTINGS = AuditSettings(window_seconds=60, slack_seconds=10, settle_seconds=30, interval_seconds=1,
                         max_windows=5, start_back_seconds=600)


@pytest_asyncio.fixture
async def clean(payments_pool):
    async def wipe():
        await payments_pool.execute("DELETE FROM audit_watermarks WHERE name = $1", WATERMARK)
        await payments_pool.execute("DELETE FROM metrics_leases WHERE name = $1", LEASE)
    await wipe()
    yield
    await wipe()


def auditor(pool, world, name, settings=SETTINGS):
    return Auditor(pool, world, world, world, settings=settings, worker_id=name)


async def test_replicas_audit_each_window_once_in_order(payments_pool, clean):
    world = EmptyWorld()
    a, b = auditor(payments_pool, world, "replica-a"), auditor(payments_pool, world, "replica-b")
    rounds = await asyncio.gather(a.round(), b.round())
    assert sorted(len(r) for r in rounds) == [0, 5]  # one leads, the other does nothing
    (done,) = [r for r in rounds if r]
    assert all(x.end == y.start for x, y in zip(done, done[1:]))  # consecutive, no gap, no overlap
    mark = await payments_pool.fetchval("SELECT watermark FROM audit_watermarks WHERE name = $1", WATERMARK)
    assert mark == done[-1].end
    # the leader's next round carries on from there; the other still does nothing
    leader = a if rounds[0] else b
    other = b if leader is a else a
    more = await leader.round()
    assert more and more[0].start == mark and await other.round() == []
    asked = [w[0] for w in world.windows]
    assert len(asked) == len(set(asked)) == len(done) + len(more), asked  # no window asked twice
    # windows end at least the settle time ago: the last one ends before now - settle
    now = await payments_pool.fetchval("SELECT clock_timestamp()")
    assert more[-1].end <= now - timedelta(seconds=SETTINGS.settle_seconds)


async def test_a_replica_whose_lease_was_taken_over_cannot_move_the_watermark(payments_pool, clean):
    world = EmptyWorld()
    stale = auditor(payments_pool, world, "stale")
    await stale.round()
    mark = await payments_pool.fetchval("SELECT watermark FROM audit_watermarks WHERE name = $1", WATERMARK)
    # another replica takes the lease over (the stale one stalled past it) and moves on
    await payments_pool.execute("UPDATE metrics_leases SET expires_at = clock_timestamp() - interval '1 second' "
                                "WHERE name = $1", LEASE)
    fresh = auditor(payments_pool, world, "fresh")
    assert await fresh.round()
    moved = await payments_pool.fetchval("SELECT watermark FROM audit_watermarks WHERE name = $1", WATERMARK)
    assert moved > mark
    # the stale replica, resuming a window it had started from the old watermark, is fenced
    assert await payments_pool.execute("UPDATE audit_watermarks SET watermark = $3 WHERE name = $1 AND watermark = $2",
                                       WATERMARK, mark, mark + timedelta(seconds=60)) == "UPDATE 0"
    assert await stale.round() == []  # and it no longer leads
    assert await payments_pool.fetchval("SELECT watermark FROM audit_watermarks WHERE name = $1", WATERMARK) == moved


async def test_catching_up_the_job_rests_between_batches_by_its_duty_cycle(payments_pool, clean):
    world = EmptyWorld(takes=0.1)
    job = auditor(payments_pool, world, "catching-up", dataclasses.replace(SETTINGS, duty_cycle=0.25))
    done = await job.round()
    assert len(done) == 5  # every due window of the round, in batches of 2, 2 and 1
    first, second, third = world.asked_at[0], world.asked_at[2], world.asked_at[4]
    # each batch took at least 0.1 s, so the next began at least 0.1 + 3 * 0.1 s after it
    assert second - first >= 0.4 and third - second >= 0.4


async def test_a_rest_longer_than_half_the_lease_ends_the_round_and_the_next_goes_on(payments_pool, clean):
    world = EmptyWorld()
    job = auditor(payments_pool, world, "resting")
    job.duty.free_at = time.monotonic() + job.leader.ttl  # a long batch just ended
    assert await job.round() == []  # it keeps its lease (renewed at each round) rather than sleep past it
    assert world.windows == []
    job.duty.free_at = 0.0  # rested
    assert len(await job.round()) == SETTINGS.max_windows


async def test_the_second_looks_find_a_payment_and_its_checkout_by_each_key(scratch_db):
    """The statements of the second looks (a charge's payment, a hold's checkout by its payment or
    its payment attempt key, an order's checkout), on rows of the real schema (a database of its
    own: a completed checkout is never deleted)."""
    import pathlib
    import uuid

    from cutylib.db import create_pool, migrate
    from payments import audit

    await migrate(scratch_db, pathlib.Path(__file__).resolve().parents[3] / "services/payments/migrations")
    payments_pool = await create_pool(scratch_db, min_size=1, max_size=2)

    checkout, payment, key = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    intent = "pi_" + uuid.uuid4().hex
    await payments_pool.execute(
        "INSERT INTO checkouts (id, customer_id, kind, state, slot_id, hold_id, amount_minor, currency, expire_time, "
        "payment_key, payment_id, payment_method, merchant_id, salon_id, free_cancellation_hours, "
        "cancellation_fee_percent, start_time) VALUES ($1, 'cust-audit', 'booking', 'COMPLETED', $4, 'h-1', 100, 'TRY', "
        "clock_timestamp(), $2, $3, 'pm_card_ok', 'merchant-audit', $4, 24, 0, clock_timestamp() + interval '1 day')",
        checkout, key, payment, uuid.uuid4())
    await payments_pool.execute(
        "INSERT INTO payments (id, checkout_id, status, psp_intent_id, amount_minor, currency, payment_method, "
        "idempotency_key, merchant_id) VALUES ($1, $2, 'created', $3, 100, 'TRY', 'pm_card_ok', $4, 'merchant-audit')",
        payment, checkout, intent, str(key))
    try:
        (p,) = await payments_pool.fetch(audit.PAYMENTS_BY_INTENT, [intent, "pi_none"])
        assert (p["id"], p["checkout_id"], p["checkout_state"]) == (payment, checkout, "COMPLETED")
        by_ref = await payments_pool.fetch(audit.CHECKOUTS_BY_REF, [payment, key], ["merchant-audit"] * 2)
        assert sorted(r["ref"] for r in by_ref) == sorted([str(payment), str(key)])
        assert {r["id"] for r in by_ref} == {checkout} and {r["hold_id"] for r in by_ref} == {"h-1"}
        (c,) = await payments_pool.fetch(audit.CHECKOUTS_BY_ID, [checkout, uuid.uuid4()])
        assert c["state"] == "COMPLETED"
        assert await payments_pool.fetch(audit.OUR_REFUNDS, ["re_none"]) == []
    finally:
        await payments_pool.close()


class OlderWorld(EmptyWorld):
    """Booking and the code pool of a version before the summaries (mid-rollout), and a PSP without
    a balance report (its list API only)."""

    charge_lists = 0

    async def SummarizeHolds(self, request, timeout=None):
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   "Method not found!")

    SummarizeDeliveries = SummarizeHolds

    async def balance_report(self, gte, lt, bucket_count):
        raise PspError(404, {"type": "invalid_request_error", "code": "route_missing", "message": "Not Found"})

    async def list_charges(self, gte, lt, **kw):
        self.charge_lists += 1
        return {"data": [], "has_more": False}


async def test_services_without_summaries_are_read_row_by_row_and_the_round_goes_on(payments_pool, clean):
    world = OlderWorld()
    done = await auditor(payments_pool, world, "rollout").round()
    assert len(done) == SETTINGS.max_windows  # every due window audited, none failed
    assert world.pages == 2 * len(done)  # each window's holds and orders read whole, one page each
    assert world.charge_lists == len(done)  # and its charges listed whole


async def test_the_window_summary_sums_what_each_checkout_expects_and_the_drill_reads_its_buckets(scratch_db):
    """Payments' side of the summaries (audit.SUMMARY, one statement): per bucket, what each
    checkout of the window expects of booking (its hold confirmed with its payment), the code pool
    (its order with its quantity) and the PSP's balance report (its charge: intent, amount,
    refunded), fingerprinted as cutylib.digests does in Python; a captured payment whose checkout
    was not sold expects what no PSP reports. The drill-down reads only the checkouts of the buckets
    named."""
    import pathlib
    import uuid
    from datetime import datetime, timezone

    from cutylib import digests
    from cutylib.db import create_pool, migrate
    from payments import audit

    await migrate(scratch_db, pathlib.Path(__file__).resolve().parents[3] / "services/payments/migrations")
    pool = await create_pool(scratch_db, min_size=1, max_size=2)
    n = 64
    rows = []  # (checkout, kind, state, payment status, refunded)
    for kind, state, status, refunded in (("booking", "COMPLETED", "succeeded", 0),
                                          ("codes", "COMPLETED", "partially_refunded", 40),
                                          ("codes", "FAILED", "succeeded", 0),  # captured, not sold: unresolved
                                          ("booking", "EXPIRED", "failed", 0)):  # nothing captured, nothing expected
        checkout, payment, intent = uuid.uuid4(), uuid.uuid4(), "pi_" + uuid.uuid4().hex
        hold = str(uuid.uuid4()) if kind == "booking" else None
        await pool.execute(
            "INSERT INTO checkouts (id, customer_id, kind, state, slot_id, product_id, quantity, hold_id, order_id, "
            "amount_minor, currency, expire_time, payment_key, payment_id, payment_method, merchant_id, salon_id, "
            "free_cancellation_hours, cancellation_fee_percent, start_time) VALUES ($1, 'cust', $2, $3, "
            "CASE WHEN $2 = 'booking' THEN $4::uuid END, CASE WHEN $2 = 'codes' THEN $4::uuid END, "
            "CASE WHEN $2 = 'codes' THEN 2 ELSE 1 END, $5, CASE WHEN $2 = 'codes' THEN $1::uuid END, 100, 'TRY', "
            "clock_timestamp(), $4, $6, 'pm_card_ok', 'm-1', "
            "CASE WHEN $2 = 'booking' THEN $4::uuid END, CASE WHEN $2 = 'booking' THEN 24 END, "
            "CASE WHEN $2 = 'booking' THEN 0 END, CASE WHEN $2 = 'booking' THEN clock_timestamp() END)",
            checkout, kind, state, uuid.uuid4(), hold, payment)
        await pool.execute(
            "INSERT INTO payments (id, checkout_id, status, psp_intent_id, amount_minor, refunded_minor, "
            "refund_settled_minor, currency, payment_method, idempotency_key, merchant_id) "
            "VALUES ($1, $2, $3, $4, 100, $5, $5, 'TRY', 'pm_card_ok', $6, 'm-1')",
            payment, checkout, status, intent, refunded, str(uuid.uuid4()))
        rows.append((checkout, kind, state, status, refunded, payment, intent, hold))
    a, b = datetime(2000, 1, 1, tzinfo=timezone.utc), datetime(2100, 1, 1, tzinfo=timezone.utc)
    try:
        got = audit.summary_of(await pool.fetch(audit.SUMMARY, a, b, n))
        want: dict[str, dict[int, list[int]]] = {"holds": {}, "orders": {}, "charges": {}}

        def add(side, key, *fact):
            s = want[side].setdefault(digests.bucket_of(key, n), [0, 0])
            s[0] += 1
            s[1] += digests.fingerprint_of(*fact)
        for checkout, kind, state, status, refunded, payment, intent, hold in rows:
            if kind == "booking" and state == "COMPLETED":
                add("holds", hold, hold, payment, "m-1")
            if kind == "codes" and state == "COMPLETED":
                add("orders", str(checkout), str(checkout), "m-1", 2, 0)
            if status != "failed":
                if state == "COMPLETED" or refunded:
                    add("charges", intent, intent, 100, refunded)
                else:
                    add("charges", intent, intent, "unresolved")
        assert got.pop("checkouts") == {0: digests.Bucket(0, 4, 0)}
        assert got == {side: {k: digests.Bucket(k, c, fp % digests.MOD) for k, (c, fp) in v.items()}
                       for side, v in want.items()}
        # the drill-down: only the checkouts with a key in the buckets named
        unresolved, bucket = rows[2], digests.bucket_of(rows[2][6], n)
        picked = await pool.fetch(audit.CHECKOUTS, a, b, None, None, 100, n, [], [], [bucket])
        assert unresolved[0] in {r["id"] for r in picked} and all(r["charge_bucket"] == bucket for r in picked)
        assert len(await pool.fetch(audit.CHECKOUTS, a, b, None, None, 100, n, None, None, None)) == 4
    finally:
        await pool.close()
