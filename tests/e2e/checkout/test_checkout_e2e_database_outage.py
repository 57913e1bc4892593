"""Survive the database: the stack's own PostgreSQL stops under traffic; a service is
restarted while it is down; then it comes back.

While it is down no process exits, every service's health says NOT_SERVING (liveness stays
SERVING), and calls answer UNAVAILABLE with a retry hint; once it is back, health turns SERVING and
checkouts complete again; nothing is lost or sold twice (the invariants oracle). The long version
(15 s outage) runs with `make soak`; `make test` runs a short one."""
from __future__ import annotations

import asyncio
import time
import types
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from checkout_e2e import persist, start_stack
from cuty.booking.v1 import booking_pb2 as bpb, booking_pb2_grpc
from cutylib.grpc_errors import unpack_detail
from cutylib.pgcluster import LocalCluster
from cutylib.testing.procs import ServiceProcess, wait_for
from google.rpc import error_details_pb2

S = health_pb2.HealthCheckResponse


async def health(proc: ServiceProcess, service: str = "") -> int | None:
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{proc.health_port}") as ch:
            return (await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=1)).status
    except grpc.aio.AioRpcError:
        return None


async def buyer(shop, slot: str, stop: asyncio.Event, done: list[str]) -> None:
    """One customer buying one slot, retrying through the outage with the same keys."""
    me = f"outage-{uuid.uuid4().hex[:8]}"
    ck, pk = str(uuid.uuid4()), str(uuid.uuid4())
    c = await persist(lambda: shop.create(me, slot=slot, key=ck), timeout=120, what="create through the outage")
    done.append(c.id)
    await persist(lambda: shop.pay(me, c.id, "pm_card_ok", key=pk), timeout=120, what="pay through the outage")


async def run_outage(tmp_path, outage_seconds: float) -> None:
    # Commits durable as deployed (not fast_unsafe): the test crashes the server, and with
    # synchronous_commit off a crash loses commits it had already acknowledged (a checkout answered
    # COMPLETED came back CHARGING, and its charge replay no longer matched the PSP's).
    cluster = LocalCluster(tmp_path / "pg", fast_unsafe=False)
    cluster.start()
    shop = None
    try:
        shop = await start_stack(types.SimpleNamespace(dsn=cluster.dsn), tmp_path / "stack")
        procs = shop.stack.procs
        slots = await shop.new_slots(12)
        done: list[str] = []
        stop = asyncio.Event()
        first = [asyncio.create_task(buyer(shop, s, stop, done)) for s in slots[:4]]
        await asyncio.gather(*first)

        cluster.stop("immediate")  # a crash of the database server
        down_at = time.monotonic()
        for name in ("booking", "codepool", "payments-0"):
            await wait_for(lambda n=name: _is(procs[n], S.NOT_SERVING), timeout=10,
                           message=f"{name} NOT_SERVING while the database is down")
            assert await health(procs[name], "liveness") == S.SERVING  # the process itself is fine
        # Calls answer UNAVAILABLE with a retry hint, not a hang or an internal error.
        async with shop.stack.channel("payments", "booking") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await booking_pb2_grpc.BookingServiceStub(ch).GetHold(bpb.GetHoldRequest(hold_id=str(uuid.uuid4())))
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert unpack_detail(e.value, error_details_pb2.RetryInfo).retry_delay.seconds >= 1
        # Buyers keep trying meanwhile; and booking is restarted during the outage: it starts, stays up.
        more = [asyncio.create_task(buyer(shop, s, stop, done)) for s in slots[4:]]
        old = procs["booking"]
        old.kill()
        fresh = ServiceProcess(old.module, old.env, old.log_path, grpc_port=old.grpc_port).start()
        procs["booking"] = fresh
        await wait_for(lambda: _is(fresh, S.NOT_SERVING), timeout=20, message="restarted booking answers health")
        await asyncio.sleep(max(0.0, outage_seconds - (time.monotonic() - down_at)))
        assert all(p.proc.poll() is None for p in procs.values()), "a process exited during the outage"

        cluster.start()
        back_at = time.monotonic()
        for name in ("booking", "codepool", "payments-0"):
            await wait_for(lambda n=name: _is(procs[n], S.SERVING), timeout=30, message=f"{name} SERVING again")
        serving_after = time.monotonic() - back_at
        await asyncio.wait_for(asyncio.gather(*more), timeout=120)
        print(f"database down {outage_seconds:.0f} s; every service SERVING {serving_after:.2f} s after it returned")
        for cid in done:
            await shop.until(cid, timeout=60)
        states = await shop.check_invariants(done)
        assert list(states.values()).count("COMPLETED") == len(slots), states  # every buyer got their slot
        assert all(p.proc.poll() is None for p in procs.values())
    finally:
        if shop is not None:
            await shop.close()
        cluster.destroy()


async def _is(proc: ServiceProcess, status: int) -> bool:
    return await health(proc) == status


async def test_database_outage_short(tmp_path):
    await run_outage(tmp_path, outage_seconds=3)


@pytest.mark.slow
async def test_database_outage_15s(tmp_path):
    await run_outage(tmp_path, outage_seconds=15)
