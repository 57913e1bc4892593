"""Retention of the time-partitioned, append-only tables (cutylib.retention, docs/architecture.md
"Retention"), against a real database: partitions are made ahead, the ones past the retention leave
whole (archived to a file, then dropped), the rows inside the retention stay and answer as before,
and the append-only triggers still refuse a row-by-row change. Run as the services' own role."""
from __future__ import annotations

import csv
import datetime as dt
import pathlib
import uuid

import asyncpg
import pytest
import pytest_asyncio

from cutylib.config import with_database
from cutylib.db import ALL_MERCHANTS, create_pool, migrate
from cutylib.retention import PARTITIONS_AHEAD, Retention, Table
from cutylib.testing.postgres import service_dsn
from cutylib.testing.tenancy import PARTITIONS_WITHOUT_RLS


REPO = pathlib.Path(__file__).resolve().parents[3]
GRID = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
WIDTH = dt.timedelta(days=30)

EVENTS = """
CREATE TABLE events (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id text NOT NULL,
    note        text NOT NULL,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE FUNCTION events_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'events is append-only' USING ERRCODE = 'insufficient_privilege'; END $$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events FOR EACH ROW EXECUTE FUNCTION events_refuse();
SELECT cuty_tenant_table('events');
SELECT cuty_service_role('payments_service');
"""


def grid_start(at: dt.datetime) -> dt.datetime:
    return GRID + WIDTH * ((at - GRID) // WIDTH)


async def fresh(pg, service: str | None, tmp_path) -> str:
    dsn = with_database(pg.dsn, f"retention_{uuid.uuid4().hex[:10]}")
    folder = REPO / "services" / service / "migrations" if service else tmp_path / "none"
    folder.mkdir(exist_ok=True)
    await migrate(dsn, folder)
    return dsn


async def bounds(conn, table: str) -> list[tuple]:
    return [tuple(r) for r in await conn.fetch(
        "SELECT partition, lower, upper FROM cuty_partition_bounds($1) ORDER BY upper", table)]


@pytest_asyncio.fixture
async def events_db(pg, tmp_path):
    """A database with a partitioned append-only table, four months of it older than a year."""
    dsn = await fresh(pg, None, tmp_path)
    owner = await asyncpg.connect(dsn)
    await owner.execute(EVENTS)
    now = dt.datetime.now(dt.timezone.utc)
    old = []
    for k in range(4):  # the partitions of 14..11 grid steps ago (420..330 days)
        lo = grid_start(now) - WIDTH * (14 - k)
        name = f"events_p{lo:%Y%m%d}"
        await owner.execute(f"CREATE TABLE {name} PARTITION OF events FOR VALUES FROM ('{lo.isoformat()}') "
                            f"TO ('{(lo + WIDTH).isoformat()}')")
        await owner.execute("SELECT cuty_tenant_rls($1)", name)
        await owner.execute("INSERT INTO events (at, merchant_id, note) SELECT $1::timestamptz + make_interval(hours => g), "
                            "'m1', $2 || g FROM generate_series(1, 5) g", lo, name)
        old.append((name, lo + WIDTH))
    pool = await create_pool(await service_dsn(pg.dsn, "payments", dsn), min_size=1, max_size=3,
                             merchant=ALL_MERCHANTS)
    yield dsn, owner, pool, old
    await pool.close()
    await owner.close()


async def test_the_partitions_past_the_retention_leave_whole_archived_and_the_rest_stay(events_db, tmp_path):
    dsn, owner, pool, old = events_db
    archive = tmp_path / "archive"
    job = Retention(pool, [Table("events", 365)], archive)
    done = await job.round()

    # Made ahead: the current partition and PARTITIONS_AHEAD more, so an insert always has one.
    now = dt.datetime.now(dt.timezone.utc)
    parts = await bounds(owner, "events")
    assert len(done.created) == PARTITIONS_AHEAD + 1
    assert any(lo <= now < hi for _, lo, hi in parts)
    assert await owner.fetch(PARTITIONS_WITHOUT_RLS) == []  # the new ones keep the merchants' policy
    assert max(hi for _, _, hi in parts) >= grid_start(now) + WIDTH * (PARTITIONS_AHEAD + 1)
    await pool.execute("INSERT INTO events (merchant_id, note) VALUES ('m1', 'today')")

    # Past the retention: the partitions whose rows are all older than 365 days, whole.
    cutoff = now - dt.timedelta(days=365)
    gone = [name for name, upper in old if upper <= cutoff]
    kept = [name for name, upper in old if upper > cutoff]
    assert gone and kept
    assert sorted(done.detached) == sorted(gone) == sorted(done.dropped)
    for name in gone:
        assert await owner.fetchval("SELECT to_regclass($1)", name) is None
        with open(archive / "events" / f"{name}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert [r["note"] for r in rows] == [f"{name}{g}" for g in range(1, 6)]
    # Inside the retention: every row there, as it was.
    notes = {r["note"] for r in await owner.fetch("SELECT note FROM events")}
    assert notes == {f"{name}{g}" for name in kept for g in range(1, 6)} | {"today"}

    # Still append-only, row by row, through the table and its partitions.
    for sql in ("DELETE FROM events WHERE note = 'today'", "UPDATE events SET note = 'x'"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await pool.execute(sql)
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await owner.execute(f"DELETE FROM {kept[0]}")

    # A second round has nothing to do.
    again = await job.round()
    assert (again.created, again.detached, again.dropped) == ([], [], [])


async def test_a_partition_detached_but_not_dropped_is_archived_and_dropped_next_round(events_db, tmp_path):
    dsn, owner, pool, old = events_db
    name, upper = old[0]
    # A round that crashed after its DETACH: the table is out of events, not archived, not dropped.
    await pool.fetch("SELECT cuty_partitions_detach('events', $1, 1000)", upper)
    assert await owner.fetchval("SELECT to_regclass($1)", name) is not None
    done = await Retention(pool, [Table("events", 365)], tmp_path).round()
    assert name in done.dropped
    assert (tmp_path / "events" / f"{name}.csv").exists()
    assert await owner.fetchval("SELECT to_regclass($1)", name) is None


async def test_kept_forever_detaches_nothing_and_only_detached_partitions_can_be_dropped(events_db, tmp_path):
    dsn, owner, pool, old = events_db
    done = await Retention(pool, [Table("events", 0)], tmp_path).round()
    assert done.detached == [] and len(await bounds(owner, "events")) == len(old) + PARTITIONS_AHEAD + 1
    with pytest.raises(asyncpg.InvalidParameterValueError):
        await pool.execute("SELECT cuty_partition_drop('events', $1)", old[0][0])  # still attached
    with pytest.raises(asyncpg.InvalidParameterValueError):
        await pool.execute("SELECT cuty_partition_drop('events', 'schema_migrations')")


async def test_payment_events_are_partitioned_append_only_and_leave_whole(pg, tmp_path):
    dsn = await fresh(pg, "payments", tmp_path)
    owner = await asyncpg.connect(dsn)
    try:
        parts = await bounds(owner, "payment_events")
        legacy = [p for p in parts if p[0] == "payment_events_legacy"]
        assert legacy and legacy[0][1] is None and len(parts) == 1 + PARTITIONS_AHEAD
        assert await owner.fetch(PARTITIONS_WITHOUT_RLS) == []  # each partition keeps the merchants' policy
        checkout, later = uuid.uuid4(), uuid.uuid4()
        # A row of before (in the legacy partition) and one of after its end, in the partition ahead.
        await owner.execute("INSERT INTO payment_events (checkout_id, source, to_status, merchant_id, created_at) "
                            "VALUES ($1, 'saga', 'HELD', 'm1', clock_timestamp() - interval '90 days'), "
                            "($2, 'saga', 'HELD', 'm1', $3)", checkout, later, legacy[0][2] + dt.timedelta(hours=1))
        seqs = [r["seq"] for r in await owner.fetch("SELECT seq FROM payment_events ORDER BY seq")]
        assert len(seqs) == 2 and seqs[0] < seqs[1]
        for sql in ("DELETE FROM payment_events", "UPDATE payment_events SET note = 'x'", "TRUNCATE payment_events"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await owner.execute(sql)
        pool = await create_pool(await service_dsn(pg.dsn, "payments", dsn), min_size=1, max_size=2,
                                 merchant=ALL_MERCHANTS)
        try:
            # As if a retention had passed the legacy partition's end: it leaves whole, the rest stays.
            detached = await pool.fetchval("SELECT array_agg(p) FROM cuty_partitions_detach('payment_events', $1, 1000) p",
                                           legacy[0][2])
            assert detached == ["payment_events_legacy"]
            job = Retention(pool, [Table("payment_events", 400)], tmp_path)
            done = await job.round()
            assert done.dropped == ["payment_events_legacy"]
            with open(tmp_path / "payment_events" / "payment_events_legacy.csv", newline="") as f:
                assert [r["checkout_id"] for r in csv.DictReader(f)] == [str(checkout)]
            assert [r["checkout_id"] for r in await pool.fetch("SELECT checkout_id FROM payment_events")] == [later]
            # A new event gets a seq after every earlier one (the sequence outlived its first table).
            await pool.execute("INSERT INTO payment_events (checkout_id, source, to_status, merchant_id) "
                               "VALUES ($1, 'saga', 'PAID', 'm1')", later)
            assert await pool.fetchval("SELECT max(seq) FROM payment_events") > seqs[1]
        finally:
            await pool.close()
    finally:
        await owner.close()


async def test_the_audit_log_is_partitioned_append_only_and_its_ids_go_on(pg, tmp_path):
    dsn = await fresh(pg, "codepool", tmp_path)
    owner = await asyncpg.connect(dsn)
    try:
        assert {p[0] for p in await bounds(owner, "audit_log")} >= {"audit_log_legacy"}
        assert await owner.fetch(PARTITIONS_WITHOUT_RLS) == []  # each partition keeps the merchants' policy
        ids = [await owner.fetchval("INSERT INTO audit_log (actor, action, merchant_id, at) VALUES ('a', 'reserve', "
                                    "'m1', $1) RETURNING id", at)
               for at in (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400), dt.datetime.now(dt.timezone.utc))]
        assert ids[0] < ids[1]
        for sql in ("DELETE FROM audit_log", "UPDATE audit_log SET actor = 'x'", "TRUNCATE audit_log"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await owner.execute(sql)
        assert await owner.fetchval("SELECT count(*) FROM audit_log") == 2
    finally:
        await owner.close()
