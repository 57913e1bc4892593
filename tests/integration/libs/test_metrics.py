"""Metrics in Prometheus format: the gRPC interceptor counts every method by status code, with the
trace id as exemplar; /metrics answers on its own port; pool gauges read a real pool."""
import asyncio
import uuid

import asyncpg
import grpc
import httpx
import pytest
from prometheus_client import REGISTRY

from cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from cutylib import metrics
from cutylib.errors import AlreadyExists
from cutylib.grpc_server import GrpcServer
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import channel_as

SERVICE = "cuty.booking.v1.BookingService"
DESCRIPTOR = booking_pb2.DESCRIPTOR.services_by_name["BookingService"]


class Probe(booking_pb2_grpc.BookingServiceServicer):
    async def CreateSalon(self, request, context):
        return booking_pb2.Salon(id="s", name=request.name)

    async def HoldSlot(self, request, context):
        raise AlreadyExists("slot taken", reason="slot-unavailable")

    async def GetHold(self, request, context):
        raise ZeroDivisionError("bug")


def count(method: str, code: str) -> float:
    return REGISTRY.get_sample_value("rpc_server_call_duration_seconds_count", {
        "rpc_system": "grpc", "rpc_service": SERVICE, "rpc_method": method, "rpc_response_status_code": code}) or 0.0


@pytest.fixture
async def probe():
    server = GrpcServer("booking", 0, host="127.0.0.1")
    booking_pb2_grpc.add_BookingServiceServicer_to_server(Probe(), server.server)
    server.add_service(DESCRIPTOR, {m.name: {"gateway"} for m in DESCRIPTOR.methods})
    await server.start()
    yield server
    await server.stop()


async def test_every_rpc_is_counted_by_method_and_status_code(probe):
    before = {k: count(*k) for k in (("CreateSalon", "OK"), ("HoldSlot", "ALREADY_EXISTS"), ("GetHold", "INTERNAL"))}
    async with channel_as("gateway", f"127.0.0.1:{probe.port}", "booking") as ch:
        stub = booking_pb2_grpc.BookingServiceStub(ch)
        await stub.CreateSalon(booking_pb2.CreateSalonRequest(name="a", time_zone="UTC"))
        await stub.CreateSalon(booking_pb2.CreateSalonRequest(name="b", time_zone="UTC"))
        for call, req in ((stub.HoldSlot, booking_pb2.HoldSlotRequest(slot_id=str(uuid.UUID(int=1)), request_id="r")), (stub.GetHold, booking_pb2.GetHoldRequest(hold_id=str(uuid.UUID(int=1))))):
            with pytest.raises(grpc.aio.AioRpcError):
                await call(req)
    # The server observes after the status has gone out, so the client can see it a moment earlier.
    expected = {("CreateSalon", "OK"): 2, ("HoldSlot", "ALREADY_EXISTS"): 1, ("GetHold", "INTERNAL"): 1}
    await wait_for(lambda: all(count(*k) - before[k] >= n for k, n in expected.items()), timeout=5,
                   message="every call observed")
    assert {k: count(*k) - before[k] for k in expected} == expected


async def test_metrics_endpoint_serves_histograms_with_trace_exemplars(probe):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with channel_as("gateway", f"127.0.0.1:{probe.port}", "booking") as ch:
        await booking_pb2_grpc.BookingServiceStub(ch).CreateSalon(
            booking_pb2.CreateSalonRequest(name="x", time_zone="UTC"), metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),))
    port = metrics.start_metrics_server("booking", 0, host="127.0.0.1")
    async with httpx.AsyncClient() as c:
        plain = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
        # Exemplars are part of the OpenMetrics exposition, which Prometheus asks for.
        om = (await c.get(f"http://127.0.0.1:{port}/metrics",
                          headers={"accept": "application/openmetrics-text; version=1.0.0"})).text
    assert "# TYPE rpc_server_call_duration_seconds histogram" in plain
    assert f'trace_id="{trace_id}"' in om


async def test_pool_gauges_follow_the_pool(booking_dsn):
    pool = await asyncpg.create_pool(booking_dsn, min_size=1, max_size=3)
    metrics.register_pool("probe-pool", pool)

    def gauge(name):
        return REGISTRY.get_sample_value(name, {"pool": "probe-pool"})

    try:
        assert gauge("cuty_db_pool_max_connections") == 3
        conns = [await pool.acquire() for _ in range(3)]
        assert gauge("cuty_db_pool_connections_in_use") == 3
        waiter = asyncio.ensure_future(pool.acquire())
        await wait_for(lambda: gauge("cuty_db_pool_waiting_requests") == 1, timeout=5,
                       message="the acquire blocked on the empty pool to be counted")
        for c in conns:
            await pool.release(c)
        await pool.release(await waiter)
        assert gauge("cuty_db_pool_connections_in_use") == 0
    finally:
        pool.terminate()  # close() would wait for connections a failed assertion left acquired
        metrics._POOLS.pools.pop("probe-pool", None)


def test_a_private_registry_counts_apart():
    from payments.metrics import VERSION_CONFLICTS, PaymentsMetrics

    a, b = PaymentsMetrics(), PaymentsMetrics()
    a.version_conflicts.inc()
    assert (a.value(VERSION_CONFLICTS), b.value(VERSION_CONFLICTS)) == (1, 0)
