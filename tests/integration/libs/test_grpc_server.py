"""The shared gRPC bootstrap over real mutual TLS: who may call (certificates, caller tables, signed
users), error mapping with details, health, reflection, deadlines."""
import asyncio
import dataclasses
import datetime as dt
import time

import grpc
import jwt
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from booking.grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES
from cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from cutylib import principal
from cutylib.errors import AlreadyExists, InvalidArgument
from cutylib.grpc_client import create_channel
from cutylib.grpc_errors import bad_field, error_reason, unpack_detail
from cutylib.grpc_server import GrpcServer
from cutylib.identity import AssertionSigner
from cutylib.testing.trust import channel_as, dev_pki, reissue, trust_cas, user, write_cert
from cutylib.tls import DevPki, TlsFiles, Transport, issue, make_ca

SERVICE = booking_pb2.DESCRIPTOR.services_by_name["BookingService"]
CREATE = booking_pb2.CreateSalonRequest(name="x", time_zone="UTC")
# Requests that keep their contracts (the server checks every request before the handler).
SLOT = "00000000-0000-4000-8000-000000000001"
HOLD = booking_pb2.HoldSlotRequest(slot_id=SLOT, request_id="r-1")
GET_HOLD = booking_pb2.GetHoldRequest(hold_id=SLOT)
LIST_SLOTS = booking_pb2.ListSlotsRequest(salon_id=SLOT, start_time={"seconds": 1}, end_time={"seconds": 2})


class Probe(booking_pb2_grpc.BookingServiceServicer):
    """Answers with who called: Salon(id=subject, name=role, time_zone=org)."""

    async def CreateSalon(self, request, context):
        if not request.name:
            raise InvalidArgument("name", "name must not be empty")
        p = principal.current()
        return booking_pb2.Salon(id=p.subject, name=p.role, time_zone=p.org)

    async def HoldSlot(self, request, context):
        raise AlreadyExists("slot taken", reason="slot-unavailable",
                            detail=booking_pb2.SlotUnavailable(slot_id=request.slot_id))

    async def ListSlots(self, request, context):
        await asyncio.sleep(5)
        return booking_pb2.ListSlotsResponse()

    async def GetHold(self, request, context):
        raise ZeroDivisionError("bug")


async def _serve(transport: Transport | None = None) -> GrpcServer:
    server = GrpcServer("booking", 0, host="127.0.0.1", transport=transport)
    booking_pb2_grpc.add_BookingServiceServicer_to_server(Probe(), server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    server.add_health_port("127.0.0.1", 0)
    await server.start()
    return server


@pytest.fixture
async def probe_server():
    server = await _serve()
    yield server
    await server.stop()


def addr(server) -> str:
    return f"127.0.0.1:{server.port}"


def stub(ch):
    return booking_pb2_grpc.BookingServiceStub(ch)


async def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code()


async def test_domain_errors_become_status_with_details(probe_server):
    async with channel_as("gateway", addr(probe_server), "booking") as gw, \
            channel_as("payments", addr(probe_server), "booking") as pay:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(gw).CreateSalon(booking_pb2.CreateSalonRequest(name=""), metadata=user("a", "admin"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_field(e.value) == "name"

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(pay).HoldSlot(HOLD)
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert error_reason(e.value) == "slot-unavailable"
        assert unpack_detail(e.value, booking_pb2.SlotUnavailable).slot_id == SLOT

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(pay).GetHold(GET_HOLD)
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert "bug" not in e.value.details() and "ZeroDivision" not in e.value.details()  # no internals leak


async def test_the_user_is_the_signed_assertion_and_never_plain_metadata(probe_server):
    async with channel_as("gateway", addr(probe_server), "booking", deadline_seconds=0.3) as ch:
        salon = await stub(ch).CreateSalon(CREATE, metadata=user("user-1", "admin", "org-7"))
        assert (salon.id, salon.name, salon.time_zone) == ("user-1", "admin", "org-7")
        # Forged plain metadata changes nothing: without an assertion the gateway's call has no user.
        forged = (("cuty-role", "admin"), ("cuty-subject", "root"), ("cuty-org", "org-7"))
        salon = await stub(ch).CreateSalon(CREATE, metadata=forged)
        assert (salon.id, salon.name) == ("", "anonymous")
        # An assertion signed by any other key, or expired, is refused outright.
        other = DevPki(dev_pki().folder.parent / "other-pki").ensure()
        mallory = AssertionSigner((other.folder / "user-assertion.key").read_bytes()).metadata(
            principal.Principal("root", "admin"), "booking")
        assert await code_of(stub(ch).CreateSalon(CREATE, metadata=mallory)) == grpc.StatusCode.UNAUTHENTICATED
        old = AssertionSigner((dev_pki().folder / "user-assertion.key").read_bytes(), ttl_seconds=60,
                              clock=lambda: 1_000_000.0).metadata(principal.Principal("u", "admin"), "booking")
        assert await code_of(stub(ch).CreateSalon(CREATE, metadata=old)) == grpc.StatusCode.UNAUTHENTICATED
        assert await code_of(stub(ch).CreateSalon(CREATE, metadata=(("cuty-user", "x" * 5000),))) == \
            grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(ch).ListSlots(LIST_SLOTS)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_the_client_channel_forwards_no_user_and_defaults_the_deadline(probe_server):
    """What a service's onward call carries (cutylib.grpc_client): never the user it is serving
    (only the gateway brings users, each signed for one service), a user only when the call names
    one itself; the default deadline unless the call sets its own."""
    async with channel_as("gateway", addr(probe_server), "booking", deadline_seconds=0.3) as ch:
        with principal.acting_as(principal.Principal("user-9", "staff", "org-3")):
            assert (await stub(ch).CreateSalon(CREATE)).name == "anonymous"
            salon = await stub(ch).CreateSalon(CREATE, metadata=user("user-1", "admin", "org-7"))
            assert (salon.id, salon.name) == ("user-1", "admin")
        started = asyncio.get_running_loop().time()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(ch).ListSlots(LIST_SLOTS, timeout=1.0)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert asyncio.get_running_loop().time() - started >= 0.9  # its own 1 s, not the channel's 0.3 s


async def _serve_table(table, **access) -> GrpcServer:
    server = GrpcServer("booking", 0, host="127.0.0.1")
    booking_pb2_grpc.add_BookingServiceServicer_to_server(Probe(), server.server)
    server.add_service(SERVICE, table, **access)
    await server.start()
    return server


EVERYONE = {m.name: {"gateway", "payments", "booking"} for m in SERVICE.methods}


async def test_system_is_granted_per_rpc_not_per_peer():
    """A peer listed for an RPC is `system` there only if the RPC grants `system`; elsewhere its
    call without a user is refused, whoever it is (the orchestrator, the service itself)."""
    granted = await _serve_table(EVERYONE, system={"CreateSalon"})
    not_granted = await _serve_table(EVERYONE, system=set(SYSTEM_RPCS))  # CreateSalon is not a system RPC
    try:
        for identity, role in (("payments", "system"), ("booking", "system"), ("gateway", "anonymous")):
            async with channel_as(identity, addr(granted), "booking") as ch:
                assert (await stub(ch).CreateSalon(CREATE)).name == role, identity
            async with channel_as(identity, addr(not_granted), "booking") as ch:
                if identity == "gateway":
                    assert (await stub(ch).CreateSalon(CREATE)).name == "anonymous"
                else:
                    assert await code_of(stub(ch).CreateSalon(CREATE)) == grpc.StatusCode.PERMISSION_DENIED, identity
    finally:
        await granted.stop()
        await not_granted.stop()


async def test_users_come_only_from_the_gateway():
    """An assertion that is valid in every way (the gateway's key, this service's audience) is
    still refused from any other peer, even one the RPC lists: an intruder in payments cannot act
    as a user it saw or made up."""
    server = await _serve_table(EVERYONE, system={m.name for m in SERVICE.methods})
    try:
        admin = user("root", "admin", "org-7", service="booking")
        for identity in ("payments", "booking"):
            async with channel_as(identity, addr(server), "booking") as ch:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub(ch).CreateSalon(CREATE, metadata=admin)
                assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, identity
                assert "only the gateway" in e.value.details()
        async with channel_as("gateway", addr(server), "booking") as ch:
            assert (await stub(ch).CreateSalon(CREATE, metadata=admin)).id == "root"
    finally:
        await server.stop()


async def test_an_assertion_is_for_one_service_only(probe_server):
    """The gateway signs a user for the service it calls: one signed for the code pool (or for
    every service at once) is refused by booking, even from the gateway."""
    async with channel_as("gateway", addr(probe_server), "booking") as ch:
        for_codepool = user("a", "admin", service="codepool")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(ch).CreateSalon(CREATE, metadata=for_codepool)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "not for booking" in e.value.details()
        now = int(time.time())
        everyone = jwt.encode({"iss": "cuty-gateway", "aud": ["cuty-booking", "cuty-codepool"], "sub": "a",
                               "role": "admin", "org": "org-7", "iat": now, "exp": now + 60},
                              (dev_pki().folder / "user-assertion.key").read_bytes(), algorithm="ES256")
        assert await code_of(stub(ch).CreateSalon(CREATE, metadata=(("cuty-user", everyone),))) == \
            grpc.StatusCode.UNAUTHENTICATED
        assert (await stub(ch).CreateSalon(CREATE, metadata=user("a", "admin", service="booking"))).id == "a"


async def test_only_the_services_user_roles_pass():
    """Each service names the user roles the gateway may bring it (the code pool: no customers);
    any other role is refused before a handler runs."""
    server = await _serve_table(CALLERS, system=SYSTEM_RPCS, roles={"staff", "admin", "operator"})
    try:
        async with channel_as("gateway", addr(server), "booking") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub(ch).CreateSalon(CREATE, metadata=user("c", "customer"))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "customer" in e.value.details()
            assert (await stub(ch).CreateSalon(CREATE, metadata=user("s", "staff"))).name == "staff"
    finally:
        await server.stop()


async def test_each_rpc_only_from_the_services_in_its_table(probe_server):
    pki = dev_pki()
    async with channel_as("gateway", addr(probe_server), "booking") as gw, \
            channel_as("payments", addr(probe_server), "booking") as pay, \
            channel_as("intruder", addr(probe_server), "booking") as intruder:
        admin = user("a", "admin")
        assert await code_of(stub(gw).HoldSlot(HOLD, metadata=admin)) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(stub(pay).CreateSalon(CREATE, metadata=admin)) == grpc.StatusCode.PERMISSION_DENIED
        # A valid certificate of the same CA, for a service no table names.
        assert await code_of(stub(intruder).CreateSalon(CREATE, metadata=admin)) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(stub(intruder).HoldSlot(HOLD)) == \
            grpc.StatusCode.PERMISSION_DENIED
    assert pki.cert_path("intruder").exists()


async def test_callers_without_a_valid_certificate_never_reach_the_service(probe_server, tmp_path):
    pki = dev_pki()
    ca_key, ca_cert = pki.ca_key(), pki.ca_path.read_bytes()
    now = dt.datetime.now(dt.timezone.utc)

    def transport(key_cert, ca=ca_cert) -> Transport:
        return Transport("gateway", TlsFiles("gateway", ca, key_cert[1], key_cert[0]))

    other_ca_key, other_ca = make_ca("Not Cuty")
    bad = {
        "expired": transport(issue(ca_key, ca_cert, "gateway", not_before=now - dt.timedelta(days=10), days=1)),
        "not yet valid": transport(issue(ca_key, ca_cert, "gateway", not_before=now + dt.timedelta(days=1))),
        "another CA": transport(issue(other_ca_key, other_ca, "gateway"), ca=ca_cert + other_ca),
    }
    for what, t in bad.items():
        async with create_channel(addr(probe_server), "booking", t, deadline_seconds=3) as ch:
            assert await code_of(stub(ch).CreateSalon(CREATE, metadata=user("a", "admin"))) == \
                grpc.StatusCode.UNAVAILABLE, what
    # No client certificate at all, and plaintext: the handshake fails.
    creds = grpc.ssl_channel_credentials(root_certificates=ca_cert)
    async with grpc.aio.secure_channel(addr(probe_server), creds,
                                       options=[("grpc.ssl_target_name_override", "booking")]) as ch:
        assert await code_of(stub(ch).CreateSalon(CREATE, timeout=3)) == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.insecure_channel(addr(probe_server)) as ch:
        assert await code_of(stub(ch).CreateSalon(CREATE, timeout=3)) == grpc.StatusCode.UNAVAILABLE


async def test_ca_rotation_with_two_cas_trusted(tmp_path):
    """During rotation every party trusts the old and the new CA; certificates of either work."""
    old, new = DevPki(tmp_path / "old").ensure(), DevPki(tmp_path / "new").ensure()
    both = old.ca_path.read_bytes() + new.ca_path.read_bytes()

    def rotating(pki: DevPki, identity: str) -> Transport:
        f = pki.files(identity)
        return Transport(identity, dataclasses.replace(f, ca=both))

    server = await _serve(rotating(new, "booking"))  # the server already has its new certificate
    try:
        for pki in (old, new):
            async with create_channel(addr(server), "booking", rotating(pki, "gateway")) as ch:
                assert (await stub(ch).CreateSalon(CREATE)).name == "anonymous"
        # A client that trusts only the old CA cannot verify the server's new certificate.
        async with create_channel(addr(server), "booking", old_only := Transport("gateway", old.files("gateway")),
                                  deadline_seconds=3) as ch:
            assert old_only.secure
            assert await code_of(stub(ch).CreateSalon(CREATE)) == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop()


async def test_plaintext_only_when_asked_and_never_in_production(monkeypatch):
    monkeypatch.setenv("CUTY_TLS", "off")
    assert not Transport.from_env("booking").secure
    monkeypatch.setenv("CUTY_ENV", "production")
    with pytest.raises(SystemExit, match="CUTY_TLS=off"):
        Transport.from_env("booking")
    monkeypatch.delenv("CUTY_TLS")
    with pytest.raises(SystemExit, match="CUTY_TLS_CA"):
        Transport.from_env("booking")
    monkeypatch.setenv("CUTY_TLS_CERT", "/nonexistent")
    with pytest.raises(SystemExit, match="incomplete"):
        Transport.from_env("booking")


async def test_a_caller_table_must_name_every_rpc():
    server = GrpcServer("booking", 0, host="127.0.0.1")
    with pytest.raises(ValueError, match="HoldSlot"):
        server.add_service(SERVICE, {k: v for k, v in CALLERS.items() if k != "HoldSlot"})


async def test_health_in_plaintext_on_its_own_port_and_reflection(probe_server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{probe_server.health_port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="cuty.booking.v1.BookingService"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        # Nothing else answers on the health port.
        assert await code_of(stub(ch).CreateSalon(CREATE)) == grpc.StatusCode.UNIMPLEMENTED
    async with channel_as("gateway", addr(probe_server), "booking") as ch:
        rs = reflection_pb2_grpc.ServerReflectionStub(ch)

        async def one():
            yield reflection_pb2.ServerReflectionRequest(list_services="")
        async for r in rs.ServerReflectionInfo(one()):
            names = {s.name for s in r.list_services_response.service}
            assert "cuty.booking.v1.BookingService" in names


async def test_no_reflection_in_production(monkeypatch):
    monkeypatch.setenv("CUTY_ENV", "production")
    server = await _serve(Transport("booking", dev_pki().files("booking")))
    try:
        async with channel_as("gateway", addr(server), "booking") as ch:
            rs = reflection_pb2_grpc.ServerReflectionStub(ch)

            # No request message: the server answers the call's headers with UNIMPLEMENTED, and a
            # message sent while that answer arrives makes grpcio report INTERNAL instead.
            async def none():
                return
                yield
            with pytest.raises(grpc.aio.AioRpcError) as e:
                async for _ in rs.ServerReflectionInfo(none()):
                    pass
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop()


async def test_certificates_are_reloaded_without_a_restart(tmp_path, monkeypatch):
    """A CA rotation (docs/security.md, "Rotation") under a running server and a long-lived client
    channel, both watching their files: trust both CAs, re-issue from the new one, trust only the new
    one. Calls keep succeeding on the same channel; once re-issued, the server presents the new
    certificate and accepts a peer that has only a certificate of the new CA; at the end, one of the
    old CA is refused. A half-written pair (the key without its certificate) is not taken."""
    monkeypatch.setenv("CUTY_TLS_RELOAD_SECONDS", "0.1")
    live, new = DevPki(tmp_path / "live").ensure(), DevPki(tmp_path / "new").ensure()
    old_gateway = Transport("gateway", live.files("gateway"))  # fixed files of the old CA
    server = await _serve(Transport.watching("booking", live.paths("booking")))
    client = create_channel(addr(server), "booking", Transport.watching("gateway", live.paths("gateway")),
                            deadline_seconds=3)

    async def calls_succeed():
        assert (await stub(client).CreateSalon(CREATE)).name == "anonymous"

    async def after_reload():
        await asyncio.sleep(0.25)
        await calls_succeed()

    try:
        await calls_succeed()
        trust_cas(live, live, new)
        await after_reload()
        reissue(live, "booking", new)
        cert = reissue(live, "gateway", new, key_only=True)  # the client sees a key without its certificate
        await after_reload()
        assert client.generation == 1  # the CA bundle only: the half-written pair is not taken
        write_cert(live, "gateway", cert)
        await after_reload()
        assert client.generation == 2
        new_only = Transport("gateway", new.files("gateway"))  # trusts only the new CA
        async with create_channel(addr(server), "booking", new_only, deadline_seconds=3) as ch:
            assert (await stub(ch).CreateSalon(CREATE)).name == "anonymous"
        trust_cas(live, new)
        await after_reload()
        async with create_channel(addr(server), "booking", old_gateway, deadline_seconds=3) as ch:
            assert await code_of(stub(ch).CreateSalon(CREATE)) == grpc.StatusCode.UNAVAILABLE
        await calls_succeed()
    finally:
        await client.close()
        await server.stop()


async def test_a_request_breaking_its_contract_is_refused_before_the_handler(probe_server):
    """The interceptor checks every request against the protos' buf.validate rules: the Probe would
    answer CreateSalon for any non-empty name, so an INVALID_ARGUMENT naming time_zone is the
    contract's, and every violation is a BadRequest field violation."""
    async with channel_as("gateway", addr(probe_server), "booking") as gw:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(gw).CreateSalon(booking_pb2.CreateSalonRequest(name="x", time_zone="not a zone!",
                                                                      free_cancellation_hours=-1),
                                       metadata=user("a", "admin"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == "time_zone"
    assert e.value.details() == ("time_zone: does not match regex pattern `^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$`; "
                                 "free_cancellation_hours: must be greater than or equal to 0 and less than or equal "
                                 "to 8760")
    br = unpack_detail(e.value, error_details_pb2.BadRequest)
    assert [v.field for v in br.field_violations] == ["time_zone", "free_cancellation_hours"]
