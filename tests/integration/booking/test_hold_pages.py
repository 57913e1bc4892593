"""A hold's database work does not grow with the holds that are live: with statistics taken before
the day's holds (none held then; a big table is analysed seldom) and 1,500 held on one chair,

- a free time is won by the INSERT alone: the lookup of stale holds (expired, not swept yet, still
  blocking the time) runs only when the INSERT meets a conflict;
- a held hold is found by its key (confirm, release, extend), never by a whole scan of the index of
  held holds, which those statistics make look free (booking/repository.py, HELD).

Measured as the service's role (Row-Level Security, as in production), in pages (EXPLAIN (ANALYZE,
BUFFERS) of the call, its nested statements included; docs/benchmarks.md, "Growth")."""
from __future__ import annotations

import uuid

import asyncpg

from booking.repository import CONFIRM_HOLD, EXTEND_HOLD, RELEASE_HOLD, SWEEP_EXPIRED
from cutylib.testing.plans import explained, nodes, pages
from cutylib.testing.postgres import service_dsn

LIVE = 1_500
MAX_PAGES = 80  # a take reads ~40 (the slot, the salon, the caps, the INSERT and its indexes)
SWEEP_MAX_PAGES = 400  # twelve due holds, each expired by its key with its indexes
MERCHANT = "merchant-hold-pages"

SALON = f"INSERT INTO salons (id, name, time_zone, merchant_id) VALUES ($1, 'Pages', 'Europe/Berlin', '{MERCHANT}')"
CHAIR = f"INSERT INTO resources (id, salon_id, name, merchant_id) VALUES ($2, $1, 'Chair', '{MERCHANT}')"
# Slot g: the (g)-th half hour from tomorrow on the one chair.
SLOTS = f"""
INSERT INTO slots (id, salon_id, resource_id, start_time, end_time, price_minor, currency, merchant_id)
SELECT gen_random_uuid(), $1, $2, t.s, t.s + interval '30 minutes', 5000, 'EUR', '{MERCHANT}'
FROM generate_series(1, $3::int) g,
     LATERAL (SELECT date_trunc('day', now()) + interval '1 day' + make_interval(mins => 30 * g) AS s) t
RETURNING id
"""
# What the statistics were taken from: 20,000 finished holds of 200 other merchants on 2,000 chairs,
# an hour each, back from now (their slots and salons are not what is measured: no foreign keys).
HISTORY = """
INSERT INTO holds (id, slot_id, salon_id, resource_id, customer_id, request_id, status, start_time, end_time,
                   price_minor, currency, expires_at, payment_ref, created_at, updated_at, merchant_id)
SELECT gen_random_uuid(), gen_random_uuid(), md5('salon' || (g % 200))::uuid, md5('res' || (g % 2000))::uuid,
       'cust-' || (g % 5000), 'req-' || g, st.status, t.s, t.s + interval '1 hour', 75000, 'TRY',
       t.s - interval '1 day' + interval '10 minutes', CASE WHEN st.status = 'confirmed' THEN 'pay-' || g END,
       t.s - interval '1 day', t.s - interval '1 day' + interval '1 minute', 'shop-' || (g % 200)
FROM generate_series(1, 20000) g,
     LATERAL (SELECT date_trunc('hour', now()) - make_interval(hours => (g / 2000)::int + 1) AS s) t,
     LATERAL (SELECT CASE g % 20 WHEN 0 THEN 'expired' WHEN 1 THEN 'released' ELSE 'confirmed' END AS status) st
"""
TAKE = "SELECT * FROM booking_take_hold($1, $2, $3, $4, 300, 5, 3, 0)"


async def _pages(conn: asyncpg.Connection, statement: str, *args) -> int:
    """Pages the statement touched (its nested statements included); undone."""
    return pages(await explained(conn, statement, *args))


async def _pages_of_a_take(conn: asyncpg.Connection, slot_id: uuid.UUID) -> tuple[int, int]:
    """Pages a take of the free slot touched, and the slot's holds before it (the take is undone)."""
    before = await conn.fetchval("SELECT count(*) FROM holds WHERE slot_id = $1", slot_id)
    return await _pages(conn, TAKE, uuid.uuid4(), slot_id, f"c-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex), before


async def test_a_free_time_is_won_by_the_insert_alone(own_database, pg):
    dsn = await own_database("booking")
    owner = await asyncpg.connect(dsn)
    service = None
    try:
        salon, chair = uuid.uuid4(), uuid.uuid4()
        await owner.execute("SET cuty.merchant = '*'")
        await owner.execute(SALON, salon)
        await owner.execute(CHAIR, salon, chair)
        slots = [r["id"] for r in await owner.fetch(SLOTS, salon, chair, LIVE + 20)]
        async with owner.transaction():
            await owner.execute("SET LOCAL session_replication_role = replica")
            await owner.execute(HISTORY)
        await owner.execute("ANALYZE holds")  # statistics from before the day's holds: none held
        service = await asyncpg.connect(await service_dsn(pg.dsn, "booking", dsn))
        await service.execute("SELECT set_config('cuty.merchant', $1, false)", MERCHANT)
        for slot in slots[:LIVE]:  # the day's live holds, all on the one chair
            assert (await service.fetchrow(TAKE, uuid.uuid4(), slot, f"live-{uuid.uuid4().hex[:8]}",
                                           uuid.uuid4().hex))["outcome"] == "held"
        assert await owner.fetchval("SELECT count(*) FROM holds WHERE status = 'held'") == LIVE

        # Past the first five custom plans (plpgsql's, asyncpg's prepared statements), to the cached
        # ones, maybe generic: each call measured, on a free slot / a live hold each time.
        measured = [await _pages_of_a_take(service, slot) for slot in slots[LIVE:LIVE + 12]]
        assert {before for _, before in measured} == {0}
        assert max(pages for pages, _ in measured[1:]) <= MAX_PAGES, measured
        held = [r["id"] for r in await owner.fetch("SELECT id FROM holds WHERE status = 'held' LIMIT 24")]
        for statement, args in ((CONFIRM_HOLD, ("pay-1", 0.0)), (RELEASE_HOLD, ()),
                                (EXTEND_HOLD, (60,))):
            read = [await _pages(service, statement, hold, *args) for hold in held]
            assert max(read[1:]) <= MAX_PAGES, (statement, read)
        # The sweeper's batch: a dozen due among the 1,500 held, each found and expired by its key.
        due, live = held[:12], held[12:]
        await owner.execute("UPDATE holds SET expires_at = clock_timestamp() - interval '1 second' "
                            "WHERE id = ANY($1::uuid[])", due)
        await owner.execute("ANALYZE holds_live")  # as autovacuum does after its first 1,000 holds
        await service.execute("SELECT set_config('cuty.merchant', '*', false)")  # the sweeper's, every merchant's
        read = [await _pages(service, SWEEP_EXPIRED, 500) for _ in range(8)]
        assert max(read[1:]) <= SWEEP_MAX_PAGES, read
        # its scan stops at the last due hold: no live one read and dropped by a filter
        plan = await explained(service, SWEEP_EXPIRED, 500)
        assert plan["Actual Rows"] == len(due)
        assert sum(n.get("Rows Removed by Filter", 0) for n in nodes(plan)) == 0, plan
        await service.execute("SELECT set_config('cuty.merchant', $1, false)", MERCHANT)
        # and each of them did what it says on a live hold (the same statement, not undone, once)
        assert (await service.fetchrow(CONFIRM_HOLD, live[0], "pay-1", 0.0))["outcome"] == "confirmed"
        assert (await service.fetchrow(RELEASE_HOLD, live[1]))["hold"]["status"] == "released"
        assert (await service.fetchrow(EXTEND_HOLD, live[2], 60))["hold"]["extended"]
    finally:
        if service is not None:
            await service.close()
        await owner.close()
