"""No unbounded queue inside a service, and deadlines end to end, with real concurrency against a
real gRPC server (mutual TLS) and a real PostgreSQL: the concurrency cap answers at once, a pool
wait or a statement ends at the caller's deadline, and a call whose deadline is gone starts no work."""
import asyncio
import contextlib
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from booking.grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES
from cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from cutylib import deadlines, errors
from cutylib.db import UnitOfWork, create_pool
from cutylib.grpc_server import GrpcServer
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import channel_as

SERVICE = booking_pb2.DESCRIPTOR.services_by_name["BookingService"]
SLEEPER = "cuty-test-sleeper"


class Worker(booking_pb2_grpc.BookingServiceServicer):
    """CreateSalon writes a row in its own unit of work; GetSlot waits until released; GetHold
    runs a long statement in a unit of work. `entered` counts handlers started, by method."""

    def __init__(self, pool=None):
        self.pool = pool
        self.entered = {"CreateSalon": 0, "GetSlot": 0, "GetHold": 0}
        self.release = asyncio.Event()

    async def CreateSalon(self, request, context):
        self.entered["CreateSalon"] += 1
        async with UnitOfWork(self.pool) as uow:
            await uow.conn.execute("INSERT INTO work_done (name) VALUES ($1)", request.name)
            await uow.commit()
        return booking_pb2.Salon(name=request.name)

    async def GetSlot(self, request, context):
        self.entered["GetSlot"] += 1
        await self.release.wait()
        return booking_pb2.Slot(id=request.slot_id)

    async def GetHold(self, request, context):
        self.entered["GetHold"] += 1
        async with UnitOfWork(self.pool) as uow:
            await uow.conn.execute(f"SET LOCAL application_name = '{SLEEPER}'")
            await uow.conn.execute("SELECT pg_sleep(10)")
        return booking_pb2.Hold()


class Stall(grpc.aio.ServerInterceptor):
    """An event loop too busy to look at a call before its deadline: CreateSalon calls are held
    up (the loop blocked) before their handler is looked up."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    async def intercept_service(self, continuation, details):
        if details.method.endswith("/CreateSalon"):
            time.sleep(self.seconds)  # blocks the loop, as a burst of other work would
        return await continuation(details)


@contextlib.asynccontextmanager
async def _serving(worker, **kw):
    """A booking server (mutual TLS) answering with `worker`, while the block runs: its address."""
    server = GrpcServer("booking", 0, host="127.0.0.1", **kw)
    booking_pb2_grpc.add_BookingServiceServicer_to_server(worker, server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    await server.start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop()


def _stub(ch):
    return booking_pb2_grpc.BookingServiceStub(ch)


async def _deadline_exceeded(call) -> tuple[str, float]:
    """(details, seconds it took) of `call`, which must end DEADLINE_EXCEEDED."""
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return e.value.details(), time.monotonic() - started


@pytest.fixture
async def db(scratch_db):
    """A pool of ONE connection (so a test can exhaust it) on a database with a table to write."""
    pool = await create_pool(scratch_db, min_size=1, max_size=1, acquire_timeout=5)
    await pool.execute("CREATE TABLE work_done (name text NOT NULL)")
    yield pool
    await pool.close()


async def test_the_call_beyond_the_cap_is_refused_at_once_and_streams_have_their_own_cap():
    worker = Worker()
    async with _serving(worker, max_concurrent_rpcs=4, max_streams=2) as addr:
        async with channel_as("payments", addr, "booking") as ch, channel_as("gateway", addr, "booking") as gw:
            # Two long-lived streams (health watches) take the streams' places, not the unary calls'.
            health = health_pb2_grpc.HealthStub(gw)
            watches = [health.Watch(health_pb2.HealthCheckRequest(service="")) for _ in range(2)]
            for w in watches:
                assert (await w.read()).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as e:
                third = health.Watch(health_pb2.HealthCheckRequest(service=""))
                await third.read()
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            # Four unary calls in the handlers at once, with both streams still open.
            held = [asyncio.ensure_future(_stub(ch).GetSlot(booking_pb2.GetSlotRequest(slot_id=str(uuid.UUID(int=i)))))
                    for i in range(4)]
            await wait_for(lambda: worker.entered["GetSlot"] == 4, 5, message="four calls in their handlers")
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await _stub(ch).GetSlot(booking_pb2.GetSlotRequest(slot_id=str(uuid.UUID(int=5))), timeout=5)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() - started < 0.5  # answered at once, not queued
            assert worker.entered["GetSlot"] == 4  # its handler never ran

            worker.release.set()
            assert [s.id for s in await asyncio.gather(*held)] == [str(uuid.UUID(int=i)) for i in range(4)]
            # Places free again once calls end: the next call is served.
            assert (await _stub(ch).GetSlot(booking_pb2.GetSlotRequest(slot_id=str(uuid.UUID(int=6))))).id == str(uuid.UUID(int=6))
            for w in watches:
                w.cancel()


async def test_a_pool_wait_ends_at_the_callers_deadline_without_taking_a_connection(db):
    worker = Worker(db)
    async with _serving(worker) as addr:
        async with channel_as("gateway", addr, "booking") as ch:
            taken = await db.acquire()  # the pool's only connection is busy
            try:
                details, took = await _deadline_exceeded(
                    _stub(ch).CreateSalon(booking_pb2.CreateSalonRequest(name="late", time_zone="UTC"), timeout=0.6))
                # The service's own answer (not the client giving up): DEADLINE_EXCEEDED just before
                # the deadline, not UNAVAILABLE after CUTY_DB_ACQUIRE_TIMEOUT_SECONDS (5 s).
                assert "database connection" in details
                assert 0.4 < took < 0.6
                assert worker.entered["CreateSalon"] == 1
                # Spent already on arrival (less than the margin left): refused at once.
                await _deadline_exceeded(_stub(ch).CreateSalon(booking_pb2.CreateSalonRequest(name="later", time_zone="UTC"),
                                                               timeout=deadlines.MARGIN_SECONDS / 2))
            finally:
                await db.release(taken)
            # It held nothing: the one connection is free at once, and nothing was written.
            async with db.acquire(timeout=0.1) as conn:
                assert await conn.fetchval("SELECT count(*) FROM work_done") == 0
            # With time to wait, the same call is served.
            assert (await _stub(ch).CreateSalon(booking_pb2.CreateSalonRequest(name="on time", time_zone="UTC"), timeout=2)).name \
                == "on time"


async def test_a_slow_statement_is_cancelled_by_the_database_at_the_callers_deadline(db):
    worker = Worker(db)
    async with _serving(worker) as addr:
        async with channel_as("payments", addr, "booking") as ch:
            details, took = await _deadline_exceeded(_stub(ch).GetHold(booking_pb2.GetHoldRequest(hold_id=str(uuid.UUID(int=1))), timeout=0.8))
            # PostgreSQL's statement_timeout ended it (the unit of work's SET LOCAL), in time for
            # the service to answer itself.
            assert "database statement" in details
            assert took < 0.8
        async with db.acquire(timeout=1) as conn:
            running = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'", SLEEPER)
        assert running == 0  # nothing left running for a caller that is gone


async def test_a_call_whose_deadline_passed_before_it_was_looked_at_does_no_work(db):
    """grpc cancels such a call, or the interceptor refuses it (whichever sees it first; the
    interceptor's refusal alone: tests/unit/libs/test_deadlines.py): its handler never starts."""
    worker = Worker(db)
    async with _serving(worker, interceptors=[Stall(0.4)]) as addr:
        async with channel_as("gateway", addr, "booking") as ch:
            await _deadline_exceeded(_stub(ch).CreateSalon(booking_pb2.CreateSalonRequest(name="gone", time_zone="UTC"), timeout=0.2))
        assert worker.entered["CreateSalon"] == 0  # the handler was never started
        assert await db.fetchval("SELECT count(*) FROM work_done") == 0


async def test_a_unit_of_work_takes_its_statement_timeout_from_the_deadline_in_the_same_round_trip(db):
    async with db.acquire() as conn:
        protocol = conn._con._protocol  # the pool's one connection: count what is sent on it
    show = "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"

    async def round_trips_and_timeout() -> tuple[int, int]:
        before = protocol.queries_count
        async with UnitOfWork(db) as uow:
            timeout = await uow.conn.fetchval(show)
        return protocol.queries_count - before - 1, timeout  # BEGIN and ROLLBACK, without the SHOW

    assert await round_trips_and_timeout() == (2, 0)  # outside a call: the session's default (none)
    with deadlines.within(time.monotonic() + 2.0):
        sent, timeout = await round_trips_and_timeout()
    assert sent == 2  # the SET LOCAL went with BEGIN
    assert 1500 < timeout <= 2000 - 1000 * deadlines.MARGIN_SECONDS
    assert await db.fetchval(show) == 0  # SET LOCAL ended with its transaction
    before = protocol.queries_count
    with deadlines.within(time.monotonic()):  # spent: no connection taken, no transaction begun
        with pytest.raises(errors.DeadlineExceeded):
            async with UnitOfWork(db):
                pass
    assert protocol.queries_count == before
