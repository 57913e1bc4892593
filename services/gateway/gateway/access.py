"""What every request leaves behind: a duration observation and one access-log line.

Metric: OpenTelemetry's `http.server.request.duration` as Prometheus names it,
`http_server_request_duration_seconds{http_request_method, http_route, http_response_status_code}`
(its `_count` is the request rate by route and status), with the trace id as exemplar. A request
the gateway refused to protect the platform also counts in
`cuty_gateway_requests_shed_total{http_route, criticality, reason}` (reason: `rate_limited`,
`overloaded`, `deadline`, `backend_overloaded`).

Access log: a JSON line per request on the `gateway.access` logger: method, route template (never
the raw path or query), status, duration, trace id and the token's subject. Never a token, a
header or a body. `CUTY_GATEWAY_ACCESS_LOG=0` turns the lines off (the metric stays).
"""
from __future__ import annotations

import contextvars
import logging

from prometheus_client import REGISTRY, Counter, Histogram

from cutylib.metrics import DURATION_BUCKETS

log = logging.getLogger("gateway.access")

HTTP_DURATION = Histogram(
    "http_server_request_duration_seconds", "Duration of HTTP requests served, by route and status code",
    ("http_request_method", "http_route", "http_response_status_code"), buckets=DURATION_BUCKETS, registry=REGISTRY)

SHED = Counter(
    "cuty_gateway_requests_shed", "Requests refused to protect the platform, by route, criticality and reason "
    "(rate_limited: 429; overloaded: the gateway's concurrency limit; deadline: the request's time ran out before "
    "the call; backend_overloaded: a service shed it)", ("http_route", "criticality", "reason"), registry=REGISTRY)

# The verified token's subject, set by the request handler once the token is checked.
subject: contextvars.ContextVar[str] = contextvars.ContextVar("cuty_access_subject", default="")

_children: dict[tuple[str, str, int], object] = {}
_shed_children: dict[tuple[str, str, str], object] = {}


def shed(route: str, criticality: str, reason: str) -> None:
    child = _shed_children.get((route, criticality, reason))
    if child is None:  # bounded: routes (templates) x criticalities x reasons
        child = _shed_children[(route, criticality, reason)] = SHED.labels(route, criticality, reason)
    child.inc()


def record(method: str, route: str, status: int, seconds: float, trace_id: str, *, log_line: bool = True) -> None:
    child = _children.get((method, route, status))
    if child is None:
        child = _children[(method, route, status)] = HTTP_DURATION.labels(method, route, str(status))
    child.observe(seconds, {"trace_id": trace_id} if trace_id else None)
    if log_line:
        log.info("%s %s %d", method, route, status, extra={
            "method": method, "route": route, "status": status, "duration_ms": round(seconds * 1000, 3),
            "trace_id": trace_id, "subject": subject.get()})
