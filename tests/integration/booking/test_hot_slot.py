"""The losers of a hot slot are answered from memory, and memory never outlives the truth: a freed
time is bookable again, whichever replica freed it and whether or not the listener was up."""
import asyncio

import asyncpg
import grpc

from booking import metrics
from booking_harness import tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import unpack_detail
from cutylib.testing.ids import new_id
from cutylib.testing.procs import wait_for


def losers_from_memory() -> float:
    return metrics.REGISTRY.value("cuty_booking_losers_from_memory_total")


async def _active(pool, slot_id) -> int:
    return await pool.fetchval("SELECT count(*) FROM holds h JOIN slots s ON s.resource_id = h.resource_id "
                               "AND h.during && tstzrange(s.start_time, s.end_time) "
                               "WHERE s.id = $1 AND h.status IN ('held', 'confirmed')", slot_id)


async def _lose(booking, slot_id) -> pb.SlotUnavailable:
    try:
        await booking.hold(slot_id)
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.ALREADY_EXISTS
        return unpack_detail(e, pb.SlotUnavailable)
    raise AssertionError("a held slot was held twice")


async def _listening(booking_pool, killed: list[int] = ()) -> list[int]:
    """The pids listening, once one is not among `killed` (a terminated backend lingers in
    pg_stat_activity for a moment after pg_terminate_backend)."""
    async def pids():
        found = [r["pid"] for r in await booking_pool.fetch(
            "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN \"booking_time_freed\"'")]
        return [p for p in found if p not in killed]
    await wait_for(pids, timeout=10, message="booking listening")
    return await pids()


async def test_a_rush_of_losers_mostly_skips_the_database_and_all_get_the_same_alternatives(booking, booking_pool):
    await _listening(booking_pool)
    salon, (r1, r2) = await booking.salon(resources=2)
    slots = await booking.day(salon, [r1, r2], tomorrow(18), count=3)
    target = slots[r1][0]
    winner = await booking.hold(target.id)
    first = await _lose(booking, target.id)  # this loser learns what blocks it
    before = losers_from_memory()

    results = await asyncio.gather(*(booking.hold(target.id) for _ in range(300)), return_exceptions=True)

    assert all(isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.ALREADY_EXISTS for r in results)
    alternatives = {tuple(a.id for a in unpack_detail(r, pb.SlotUnavailable).alternatives) for r in results}
    assert alternatives == {tuple(a.id for a in first.alternatives)} and len(first.alternatives) == 3
    assert losers_from_memory() - before >= 200  # a few refresh the alternatives by the database
    assert await _active(booking_pool, target.id) == 1
    # The winner's retry finds the winner's own hold, never "taken".
    again = await booking.hold(target.id, customer=winner.customer_id, request_id=winner.request_id)
    assert again.id == winner.id


async def test_a_time_released_here_is_bookable_at_once(booking, booking_pool):
    await _listening(booking_pool)
    salon, (r1,) = await booking.salon()
    target = (await booking.day(salon, [r1], tomorrow(18), count=2))[r1][0]
    winner = await booking.hold(target.id)
    await _lose(booking, target.id)
    await _lose(booking, target.id)
    await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=winner.id))
    held = await booking.hold(target.id)  # no wait: this replica freed it and forgot it
    assert held.status == pb.HOLD_STATUS_HELD


async def test_a_time_freed_by_another_replica_is_bookable_once_notified(booking, booking_pool):
    await _listening(booking_pool)
    salon, (r1,) = await booking.salon()
    target = (await booking.day(salon, [r1], tomorrow(18), count=2))[r1][0]
    winner = await booking.hold(target.id)
    await _lose(booking, target.id)
    before = losers_from_memory()
    await _lose(booking, target.id)
    assert losers_from_memory() == before + 1  # known taken
    # Another replica (here: the statement it would run) releases the hold.
    await booking_pool.execute("UPDATE holds SET status = 'released' WHERE id = $1", winner.id)

    async def bookable():
        try:
            return (await booking.hold(target.id)).status == pb.HOLD_STATUS_HELD
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.ALREADY_EXISTS
            return False
    await wait_for(bookable, timeout=5, interval=0.02, message="the freed slot bookable")


async def test_a_listener_that_lost_its_connection_forgets_everything(booking, booking_pool, booking_dsn):
    await _listening(booking_pool)
    salon, (r1,) = await booking.salon()
    target = (await booking.day(salon, [r1], tomorrow(18), count=2))[r1][0]
    winner = await booking.hold(target.id)
    await _lose(booking, target.id)
    # The listening session dies; the release after it has no trigger (a notification nobody hears).
    killed = await _listening(booking_pool)
    assert all(await asyncio.gather(*(booking_pool.fetchval("SELECT pg_terminate_backend($1)", p) for p in killed)))
    await _listening(booking_pool, killed)  # listening again: what it knew before the gap is gone
    # Triggers off takes the superuser (the service's role may not; docs/security.md).
    conn = await asyncpg.connect(booking_dsn)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute("UPDATE holds SET status = 'released' WHERE id = $1", winner.id)
    finally:
        await conn.close()
    held = await booking.hold(target.id, customer=new_id())
    assert held.status == pb.HOLD_STATUS_HELD
