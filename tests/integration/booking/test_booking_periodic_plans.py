"""The hold sweeper, which runs every few seconds on every replica, reads the held holds that are due,
not the holds: among 20,000 finished holds (confirmed, expired, released) it reads a few pages
(EXPLAIN (ANALYZE, BUFFERS) on a real table; docs/benchmarks.md, "Growth")."""
from __future__ import annotations

import shutil

import asyncpg

from booking.repository import SWEEP_EXPIRED
from cutylib.db import migrate
from cutylib.testing.plans import explained, nodes, pages
from cutylib.testing.procs import REPO

MIGRATIONS = REPO / "services" / "booking" / "migrations"

ROWS = 20_000
MAX_PAGES = 20

# `rows` holds, hold g on one of 50 chairs, an hour each, one after another back from now: no two of a
# chair overlap.
FILL_OF = """
INSERT INTO holds (id, slot_id, salon_id, resource_id, customer_id, request_id, status, start_time, end_time,
                   price_minor, currency, expires_at, payment_ref, created_at, updated_at, merchant_id)
SELECT md5('hold' || g)::uuid, md5('slot' || g)::uuid, md5('salon')::uuid, md5('res' || (g % 50))::uuid,
       'cust-' || (g % 500), 'req-' || g, st.status, t.s, t.s + interval '1 hour', 75000, 'TRY',
       t.s - interval '1 day' + interval '10 minutes', CASE WHEN st.status = 'confirmed' THEN 'pay-' || g END,
       t.s - interval '1 day', t.s - interval '1 day' + interval '1 minute', 'merchant-periodic-plan'
FROM generate_series(1, {rows}) g,
     LATERAL (SELECT date_trunc('hour', now()) - make_interval(hours => (g / 50)::int + 1) AS s) t,
     LATERAL (SELECT CASE g % 20 WHEN 0 THEN 'expired' WHEN 1 THEN 'released' ELSE 'confirmed' END AS status) st
"""
FILL = FILL_OF.format(rows=ROWS)


async def _sweep_reads(conn) -> list[tuple[str, str, int]]:
    """The sweep's plan nodes on holds and the held holds' table with the pages each touched (the
    sweep runs and is undone)."""
    return [(n["Node Type"], n["Relation Name"], pages(n)) for n in nodes(await explained(conn, SWEEP_EXPIRED, 500))
            if n.get("Relation Name") in ("holds", "holds_live")]


async def test_the_hold_sweeper_reads_the_due_holds_not_the_table(own_database):
    """On a database of the test's own (the session's shared one holds other tests' holds, some due
    now, which the sweep rightly reads): with 20,000 finished holds and none due, the sweep reads at
    most MAX_PAGES."""
    conn = await asyncpg.connect(await own_database("booking"))
    tx = conn.transaction()
    await tx.start()
    try:
        # The finished holds as a year leaves them (their slots and salon are not what is measured).
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(FILL)
        await conn.execute("SET LOCAL session_replication_role = DEFAULT")
        await conn.execute("ANALYZE holds")
        await conn.execute("ANALYZE holds_live")
        reads = await _sweep_reads(conn)
        assert reads
        assert not [r for r in reads if r[:2] == ("Seq Scan", "holds")], reads  # the held holds' table may be read whole
        assert sum(pages for _, _, pages in reads) <= MAX_PAGES, reads
    finally:
        await tx.rollback()
        await conn.close()


async def test_the_upgrade_to_the_held_holds_table_carries_each_held_hold_and_no_other(scratch_db, tmp_path):
    """Migration 0330 on a database with holds: each held hold gets its row with its expiry, no
    confirmed, expired or released one does, and the sweeper then expires the held hold that is due."""
    before = tmp_path / "before"
    shutil.copytree(MIGRATIONS, before)
    for name in ("0330_holds_live.sql", "functions/holds_live_keep.sql"):
        (before / name).unlink()
    await migrate(scratch_db, before)
    conn = await asyncpg.connect(scratch_db)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")  # no slots nor salon behind them
            await conn.execute(FILL_OF.format(rows=40))  # statuses by g % 20: 0 expired, 1 released
            await conn.execute("UPDATE holds SET status = 'held', payment_ref = NULL, expires_at = now() + interval "
                               "'5 minutes' WHERE id IN (md5('hold2')::uuid, md5('hold3')::uuid)")
            await conn.execute("UPDATE holds SET expires_at = now() - interval '1 minute' WHERE id = md5('hold3')::uuid")
        await migrate(scratch_db, MIGRATIONS)
        live = {r["hold_id"]: r["expires_at"] for r in await conn.fetch("SELECT * FROM holds_live")}
        held = {r["id"]: r["expires_at"] for r in await conn.fetch("SELECT id, expires_at FROM holds WHERE status = 'held'")}
        assert live == held and len(live) == 2
        assert [r["id"] for r in await conn.fetch(SWEEP_EXPIRED, 500)] == [
            await conn.fetchval("SELECT md5('hold3')::uuid")]
        assert await conn.fetchval("SELECT count(*) FROM holds_live") == 1  # the expired one left with it
    finally:
        await conn.close()
