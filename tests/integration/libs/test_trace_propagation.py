"""Without an exporter, cutylib's own interceptors carry W3C trace context through gRPC hops."""
import pytest

from cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from cutylib import telemetry
from cutylib.grpc_server import GrpcServer
from cutylib.testing.trust import channel_as

SERVICE = booking_pb2.DESCRIPTOR.services_by_name["BookingService"]
ANYONE = {m.name: {"gateway", "booking"} for m in SERVICE.methods}

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
# Requests that keep their contracts (the server checks every request before the handler).
SALON = booking_pb2.CreateSalonRequest(name="s", time_zone="UTC")
RESOURCE = booking_pb2.CreateResourceRequest(salon_id="00000000-0000-4000-8000-000000000001", name="r")


class Hop(booking_pb2_grpc.BookingServiceServicer):
    def __init__(self):
        self.port = 0

    async def CreateSalon(self, request, context):
        return booking_pb2.Salon(id=telemetry.current_trace_id())

    async def CreateResource(self, request, context):
        # A second hop through a cutylib channel, as the orchestrator calls booking.
        async with channel_as("booking", f"127.0.0.1:{self.port}", "booking") as ch:
            salon = await booking_pb2_grpc.BookingServiceStub(ch).CreateSalon(SALON)
        return booking_pb2.Resource(id=telemetry.current_trace_id(), name=salon.id)


@pytest.fixture
async def hop_server(monkeypatch):
    monkeypatch.setattr(telemetry, "_by_hand", True)
    hop = Hop()
    server = GrpcServer("booking", 0, host="127.0.0.1")
    booking_pb2_grpc.add_BookingServiceServicer_to_server(hop, server.server)
    server.add_service(SERVICE, ANYONE, system=ANYONE)  # the second hop is booking calling itself
    hop.port = await server.start()
    yield server
    await server.stop()


async def test_trace_id_crosses_two_grpc_hops(hop_server):
    async with channel_as("gateway", f"127.0.0.1:{hop_server.port}", "booking") as ch:
        stub = booking_pb2_grpc.BookingServiceStub(ch)
        r = await stub.CreateResource(RESOURCE, metadata=(("traceparent", TRACEPARENT),))
        assert (r.id, r.name) == (TRACE_ID, TRACE_ID)
        # Without a caller's trace, the handler still runs (a new trace, or none without a provider).
        salon = await stub.CreateSalon(SALON)
        assert salon.id != TRACE_ID
