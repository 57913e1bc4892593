"""The invariant auditor's rounds on the payments database (payments/audit.py): one replica at a
time (the lease), every window after the watermark audited once and in order, and a replica whose
lease was taken over cannot move the watermark back. The other services' digests and the PSP are
stand-ins answering empty windows (their own tests cover them); each call is counted."""
import asyncio
from datetime import timedelta

import pytest_asyncio

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cutylib.timestamps import from_timestamp
from payments.audit import LEASE, WATERMARK, AuditSettings, Auditor


class EmptyWorld:
    """Booking, the code pool and the PSP with nothing in any window; remembers the windows asked."""

    def __init__(self):
        self.windows: list[tuple] = []

    async def DigestHolds(self, request, timeout=None):
        self.windows.append((from_timestamp(request.start_time), from_timestamp(request.end_time)))
        await asyncio.sleep(0.01)
        return booking_pb2.DigestHoldsResponse()

    async def DigestDeliveries(self, request, timeout=None):
        return codepool_pb2.DigestDeliveriesResponse()

    async def list_charges(self, gte, lt, **kw):
        return {"data": [], "has_more": False}

    list_refunds = list_charges


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


def auditor(pool, world, name):
    return Auditor(pool, world, world, world, settings=SETTINGS, worker_id=name)


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
