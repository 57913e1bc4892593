"""The shared gRPC bootstrap: error mapping with details, principal propagation, health, reflection, deadlines."""
import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from cutylib import principal
from cutylib.errors import AlreadyExists, InvalidArgument
from cutylib.grpc_client import create_channel
from cutylib.grpc_errors import bad_field, error_reason, unpack_detail
from cutylib.grpc_server import GrpcServer


class Probe(booking_pb2_grpc.BookingServiceServicer):
    async def CreateSalon(self, request, context):
        if not request.name:
            raise InvalidArgument("name", "name must not be empty")
        p = principal.current()
        return booking_pb2.Salon(id=p.subject, name=p.role, time_zone=request.time_zone)

    async def HoldSlot(self, request, context):
        raise AlreadyExists("slot taken", reason="slot-unavailable",
                            detail=booking_pb2.SlotUnavailable(slot_id=request.slot_id))

    async def GetSlot(self, request, context):
        await asyncio.sleep(5)
        return booking_pb2.Slot()

    async def GetHold(self, request, context):
        raise ZeroDivisionError("bug")


@pytest.fixture
async def probe_server():
    server = GrpcServer("probe", 0, host="127.0.0.1")
    booking_pb2_grpc.add_BookingServiceServicer_to_server(Probe(), server.server)
    server.add_service_name("cuty.booking.v1.BookingService")
    await server.start()
    yield server
    await server.stop()


async def test_domain_errors_become_status_with_details(probe_server):
    async with create_channel(f"127.0.0.1:{probe_server.port}") as ch:
        stub = booking_pb2_grpc.BookingServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.CreateSalon(booking_pb2.CreateSalonRequest(name=""))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_field(e.value) == "name"

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.HoldSlot(booking_pb2.HoldSlotRequest(slot_id="s1"))
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert error_reason(e.value) == "slot-unavailable"
        assert unpack_detail(e.value, booking_pb2.SlotUnavailable).slot_id == "s1"

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.GetHold(booking_pb2.GetHoldRequest())
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert "bug" not in e.value.details()  # no internals leak


async def test_principal_travels_in_metadata_and_deadline_applies(probe_server):
    async with create_channel(f"127.0.0.1:{probe_server.port}", deadline_seconds=0.3) as ch:
        stub = booking_pb2_grpc.BookingServiceStub(ch)
        salon = await stub.CreateSalon(booking_pb2.CreateSalonRequest(name="x"),
                                       metadata=principal.Principal("user-1", "admin").metadata())
        assert (salon.id, salon.name) == ("user-1", "admin")
        salon = await stub.CreateSalon(booking_pb2.CreateSalonRequest(name="x"))
        assert (salon.id, salon.name) == ("", "system")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.GetSlot(booking_pb2.GetSlotRequest())
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_health_and_reflection(probe_server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{probe_server.port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="cuty.booking.v1.BookingService"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)

        async def one():
            yield reflection_pb2.ServerReflectionRequest(list_services="")
        async for r in stub.ServerReflectionInfo(one()):
            names = {s.name for s in r.list_services_response.service}
            assert "cuty.booking.v1.BookingService" in names
