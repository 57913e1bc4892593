"""The real gateway (in process, real HTTP via uvicorn) in front of a fake gRPC backend that answers
every annotated RPC with what the test scripts, and records what reached it.

The fake runs in cutylib's GrpcServer, so domain errors raised by a script become real gRPC
statuses with google.rpc details, exactly as the services produce them.
"""
from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field

import grpc
import httpx
import pytest
import pytest_asyncio
import uvicorn
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from google.protobuf import descriptor_pool

from cutylib import principal
from cutylib.grpc_server import GrpcServer
from cutylib.identity import PUBLIC_KEY_FILE, AssertionVerifier
from cutylib.principal import Principal
from cutylib.testing.trust import dev_pki, org_for
from cutylib.tls import TlsFiles, Transport
from cutylib.tls import issue as issue_cert
from cutylib.pgcluster import free_port
from gateway.app import Gateway
from gateway.auth import issue
from gateway.descriptors import load_routes
from gateway.httpserver import GatewayHttpProtocol
from gateway.settings import GatewaySettings

SECRET = "integration-test-secret-0123456789abcdef"

if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
    # Recording spans (no exporter) so the gateway has real trace ids to return.
    trace.set_tracer_provider(TracerProvider())


@dataclass
class Call:
    rpc: str
    request: object
    metadata: dict[str, str]
    who: Principal  # the user as the services see it: from the gateway's signed assertion


@dataclass
class FakeBackend:
    scripts: dict = field(default_factory=dict)  # rpc short name -> fn(request, metadata) -> response (None: empty)
    calls: list[Call] = field(default_factory=list)

    def last(self, rpc: str) -> Call:
        return [c for c in self.calls if c.rpc == rpc][-1]

    def handlers(self, routes) -> list[grpc.GenericRpcHandler]:
        by_service: dict[str, dict] = {}
        for r in routes:
            service, method = r.grpc_path[1:].split("/")
            by_service.setdefault(service, {})[method] = grpc.unary_unary_rpc_method_handler(
                self._behaviour(method, r.output_type),
                request_deserializer=r.input_type.FromString,
                response_serializer=r.output_type.SerializeToString)
        return [grpc.method_handlers_generic_handler(s, m) for s, m in by_service.items()]

    def _behaviour(self, method: str, output_type):
        async def handle(request, context):
            md = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in context.invocation_metadata()}
            self.calls.append(Call(method, request, md, principal.current()))
            script = self.scripts.get(method)
            if script is None:
                return output_type()
            out = script(request, md)
            out = await out if inspect.isawaitable(out) else out
            return output_type() if out is None else out
        return handle


class EveryServiceVerifier:
    """The fake's verifier: it stands in for booking, the code pool and payments, so it takes an
    assertion signed for the service that owns the called RPC (the gateway signs per service)."""

    def __init__(self, public_key: bytes):
        self.by_service = {s: AssertionVerifier([public_key], s) for s in ("booking", "codepool", "payments")}

    def verify(self, token: str):
        import jwt

        aud = jwt.decode(token, options={"verify_signature": False}).get("aud")
        verifier = self.by_service.get(aud.removeprefix("cuty-") if isinstance(aud, str) else "")
        if verifier is None:
            verifier = self.by_service["booking"]  # refuses it, as the service would
        return verifier.verify(token)


@pytest_asyncio.fixture(scope="session")
async def fake():
    routes = load_routes()
    backend = FakeBackend()
    # Stands in for every service: its certificate names all three, and the gateway may call it all.
    pki = dev_pki()
    key, cert = issue_cert(pki.ca_key(), pki.ca_path.read_bytes(), "fake", extra_names=("booking", "codepool", "payments"))
    transport = Transport("fake", TlsFiles("fake", pki.ca_path.read_bytes(), cert, key))
    server = GrpcServer("fake", 0, host="127.0.0.1", grace_seconds=0, transport=transport,
                        verifier=EveryServiceVerifier((pki.folder / PUBLIC_KEY_FILE).read_bytes()))
    server.server.add_generic_rpc_handlers(backend.handlers(routes))
    for svc in {r.grpc_path[1:].split("/")[0] for r in routes}:
        descriptor = descriptor_pool.Default().FindServiceByName(svc)
        server.add_service(descriptor, {m.name: {"gateway"} for m in descriptor.methods})
    await server.start()
    backend.server = server
    backend.addr = f"127.0.0.1:{server.port}"
    yield backend
    await server.stop()


class RunningGateway:
    def __init__(self, app: Gateway, port: int):
        self.app = app
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on",
                                                    log_level="warning", access_log=False,
                                                    http=GatewayHttpProtocol))  # as gateway.__main__
        self.task: asyncio.Task | None = None

    async def start(self) -> "RunningGateway":
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


@pytest.fixture
def script(fake):
    """script(rpc short name, fn(request, metadata)): the fake's answer for this test only."""
    added = []

    def set_(rpc, fn):
        fake.scripts[rpc] = fn
        added.append(rpc)
    yield set_
    for rpc in added:
        fake.scripts.pop(rpc, None)


@pytest_asyncio.fixture(scope="session")
async def start_gateway(fake):
    running: list[RunningGateway] = []

    async def start(**overrides) -> RunningGateway:
        owners = {r.owner for r in load_routes()}
        addr = overrides.pop("addr", fake.addr)
        settings = GatewaySettings(port=free_port(), host="127.0.0.1", jwt_secret=SECRET,
                                   backends={o: addr for o in owners}, **overrides)
        g = await RunningGateway(Gateway(settings), settings.port).start()
        running.append(g)
        return g

    yield start
    for g in running:
        await g.stop()


@pytest_asyncio.fixture(scope="session")
async def gw(start_gateway):
    return await start_gateway(deadline_seconds=2.0, rate_per_second=1000, rate_burst=1000,
                               address_rate_per_second=1000, address_rate_burst=1000)


@pytest_asyncio.fixture(scope="session")
async def client(gw):
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        yield c


def _bearer(role: str, sub: str = "user-1", secret: str = SECRET, ttl: float = 300,
            org: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue(secret, sub, role, ttl_seconds=ttl, org=org_for(role, org) or None)}"}


@pytest.fixture(scope="session")
def bearer():
    """bearer(role, sub=..., secret=..., ttl=...) -> the Authorization header of a fresh token."""
    return _bearer
