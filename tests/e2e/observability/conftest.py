"""The platform as real processes with the real OTLP exporter pointed at an in-process receiver
(built on opentelemetry-proto), the gateway in front, and each process's /metrics on a known port."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import grpc
import pytest_asyncio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from cutylib.config import DEV_JWT_SECRET, with_database
from cutylib.testing.stack import Stack


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    kind: int
    attributes: dict
    links: list[str]  # trace ids linked to


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace endpoint that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def Export(self, request, context):
        for rs in request.resource_spans:
            res = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    self.spans.append(Span(res.get("service.name", ""), s.name, s.trace_id.hex(), s.span_id.hex(),
                                           s.kind, attrs, [link.trace_id.hex() for link in s.links]))
        return trace_service_pb2.ExportTraceServiceResponse()

    def in_trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Observed:
    stack: Stack
    receiver: Receiver
    secret: str = DEV_JWT_SECRET
    notes: dict = field(default_factory=dict)


@pytest_asyncio.fixture(scope="module")
async def observed(pg, tmp_path_factory):
    receiver = Receiver()
    await receiver.server.start()
    suffix = uuid.uuid4().hex[:8]
    dbs = {f"CUTY_{s.upper()}_DATABASE_URL": with_database(pg.dsn, f"cuty_{s}_obs_{suffix}")
           for s in ("booking", "codepool", "payments")}
    env = {**dbs, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
           "OTEL_BSP_SCHEDULE_DELAY": "100", "CUTY_METRICS_REFRESH_SECONDS": "0.5",
           "CUTY_SWEEP_INTERVAL_SECONDS": "1"}
    stack = Stack(pg.dsn, tmp_path_factory.mktemp("observability"), gateway=True, env=env)
    try:
        await stack.start()
        yield Observed(stack, receiver)
    finally:
        await stack.stop()
        await receiver.server.stop(0)
