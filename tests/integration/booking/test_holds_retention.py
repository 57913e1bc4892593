"""Retention of finished holds (docs/booking.md, "Retention"), on a database of its own: the
retention job moves finished holds into the time-partitioned holds_history in bounded batches,
GetHold and a salon's agenda answer as before for a moved hold, a history partition past the
retention leaves whole (archived first), no row leaves either table by a DELETE, and the mover
racing live writes loses nothing (checked in the database afterwards)."""
from __future__ import annotations

import asyncio
import csv
import dataclasses
import datetime as dt
import random
import uuid

import asyncpg
import grpc
import pytest
import pytest_asyncio

from booking.bootstrap import create_booking_pool, create_server, holds_retention
from booking.grpc_api import CALLERS
from booking_harness import Booking, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cuty.booking.v1 import booking_pb2_grpc
from cutylib.config import Settings
from cutylib.retention import Move, Retention, Table
from cutylib.testing.retention import columns, fresh_database, moving
from cutylib.testing.tenancy import PARTITIONS_WITHOUT_RLS
from cutylib.testing.trust import acting_channel
from test_agenda import agenda, book

REPO = __import__("pathlib").Path(__file__).resolve().parents[3]
# Every finished hold, whatever its age: the mover's cutoff ten years ahead.
EVERYTHING = Move("holds", "holds_move", -3650)


@pytest_asyncio.fixture
async def fresh(pg):
    dsn, as_service = await fresh_database(pg.dsn, "booking", REPO)
    owner = await asyncpg.connect(dsn)
    pool = await create_booking_pool(as_service, dataclasses.replace(Settings(), db_pool_min=2, db_pool_max=12))
    settings = dataclasses.replace(Settings(), sweep_interval_seconds=3600)
    server = await create_server(settings, pool, port=0, host="127.0.0.1", sweeper=False)
    await server.start()
    channel = acting_channel(f"127.0.0.1:{server.port}", "booking", CALLERS, deadline_seconds=20)
    yield owner, pool, Booking(server, booking_pb2_grpc.BookingServiceStub(channel), settings)
    await channel.close()
    await server.stop()
    await pool.close()
    await owner.close()


async def where(owner, hold_id) -> list[str]:
    return [r["t"] for r in await owner.fetch(
        "SELECT 'holds' AS t FROM holds WHERE id = $1 UNION ALL SELECT 'history' FROM holds_history WHERE id = $1",
        uuid.UUID(hold_id))]


async def test_finished_holds_move_and_read_as_before_and_the_history_leaves_whole(fresh, tmp_path):
    owner, pool, booking = fresh
    salon, (r1,) = await booking.salon(resources=1)
    day = tomorrow(9)
    slots = (await booking.day(salon, [r1], day, 4))[r1]
    confirmed = await book(booking, slots[0], customer="cust-confirmed")
    released = await book(booking, slots[1], confirm=False)
    await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=released.id))
    live = await book(booking, slots[2], confirm=False)
    before = {h.id: await booking.stub.GetHold(pb.GetHoldRequest(hold_id=h.id)) for h in (confirmed, released, live)}
    local_day = (day + dt.timedelta(hours=3)).strftime("%Y-%m-%d")  # Europe/Istanbul
    agenda_before = await agenda(booking, salon, local_day)

    # Not yet finished long enough (the default week): nothing moves.
    assert (await holds_retention(pool).round()).moved == {"holds": 0}
    # Finished at all (the cutoff ahead): the confirmed and the released hold move, in batches of 1.
    done = await Retention(pool, [], None, [EVERYTHING], batch=1, limit=10).round()
    assert done.moved == {"holds": 2}
    assert await where(owner, confirmed.id) == ["history"] and await where(owner, released.id) == ["history"]
    assert await where(owner, live.id) == ["holds"]  # a held hold is live, whatever the cutoff
    assert await owner.fetch(PARTITIONS_WITHOUT_RLS) == []

    # Reads answer as before.
    for hold_id, was in before.items():
        assert await booking.stub.GetHold(pb.GetHoldRequest(hold_id=hold_id)) == was
    assert await agenda(booking, salon, local_day) == agenda_before and len(agenda_before) == 1

    # No row leaves by a DELETE: not from the live table, not from the history.
    for sql in ("DELETE FROM holds WHERE id = $1", "DELETE FROM holds_history WHERE id = $1"):
        for conn in (pool, owner):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql, uuid.UUID(live.id if "FROM holds " in sql else confirmed.id))
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await pool.execute("UPDATE holds_history SET status = 'released' WHERE id = $1", uuid.UUID(confirmed.id))

    # Past the retention, the history's partition holding them leaves whole, archived first. The
    # moved rows are in its first partition (everything up to the end of this 30-day period): a
    # retention that ends just past that partition's upper bound.
    upper = await owner.fetchval("SELECT min(upper) FROM cuty_partition_bounds('holds_history')")
    now = await owner.fetchval("SELECT clock_timestamp()")
    days = -((upper - now).days + 1)
    done = await Retention(pool, [Table("holds_history", days)], tmp_path).round()
    assert done.dropped == ["holds_history_legacy"]
    with open(tmp_path / "holds_history" / "holds_history_legacy.csv", newline="") as f:
        archived = {r["id"]: r for r in csv.DictReader(f)}
    assert set(archived) == {confirmed.id, released.id}
    assert archived[confirmed.id]["status"] == "confirmed"
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.GetHold(pb.GetHoldRequest(hold_id=confirmed.id))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert await where(owner, live.id) == ["holds"]
    # The partitions after it stay, and a hold finishing now still has one to move into (the
    # round makes the partitions before it moves).
    await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=live.id))
    assert (await Retention(pool, [Table("holds_history", 400)], None, [EVERYTHING]).round()).moved == {"holds": 1}
    assert await where(owner, live.id) == ["history"]


async def test_the_history_has_every_column_of_holds_in_order(fresh):
    owner, _, _ = fresh
    assert await columns(owner, "holds_history") == await columns(owner, "holds") + [
        ("moved_at", "timestamp with time zone")]


async def test_the_mover_racing_live_writes_loses_nothing(fresh):
    owner, pool, booking = fresh
    salon, resources = await booking.salon(resources=4)
    day = tomorrow(8)
    by_resource = await booking.day(salon, resources, day, 15, minutes=30)
    slots = [s for r in resources for s in by_resource[r]]
    holds = [await booking.hold(s.id) for s in slots]
    rnd = random.Random(26)
    rnd.shuffle(holds)
    confirmed, released = set(), set()

    async def writer(share):
        for h in share:
            if rnd.random() < 0.5:
                r = await pool.fetchrow("SELECT outcome FROM booking_confirm_hold($1, $2, 0)", uuid.UUID(h.id),
                                        "pay-" + h.id[:8])
                if r["outcome"] == "confirmed":
                    confirmed.add(h.id)
            else:
                n = await pool.execute("UPDATE holds SET status = 'released', updated_at = clock_timestamp() "
                                       "WHERE id = $1 AND status = 'held'", uuid.UUID(h.id))
                if n == "UPDATE 1":
                    released.add(h.id)
            await asyncio.sleep(0)

    shares = [holds[i::4] for i in range(4)]
    async with moving(Retention(pool, [], None, [EVERYTHING], batch=3, limit=30), "holds") as mover:
        await asyncio.gather(*(writer(s) for s in shares))
    moved = mover["moved"]
    moved += (await Retention(pool, [], None, [EVERYTHING], batch=100, limit=1000).round()).moved["holds"]

    # Every hold is in exactly one table, with the state its last write gave it.
    rows = await owner.fetch("SELECT id::text, status, 'live' AS t FROM holds UNION ALL "
                             "SELECT id::text, status, 'history' FROM holds_history")
    seen = {}
    for r in rows:
        assert r["id"] not in seen, f"hold {r['id']} is in both tables"
        seen[r["id"]] = (r["status"], r["t"])
    assert set(seen) == {h.id for h in holds}
    assert moved == len(confirmed) + len(released) == sum(1 for s, t in seen.values() if t == "history")
    assert {i for i, (s, _) in seen.items() if s == "confirmed"} == confirmed
    assert {i for i, (s, _) in seen.items() if s == "released"} == released
    assert all(t == "history" for i, (s, t) in seen.items() if i in confirmed | released)
