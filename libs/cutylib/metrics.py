"""Metrics in Prometheus format, one mechanism for every process (docs/observability.md).

prometheus_client, not the OpenTelemetry SDK's Prometheus exporter (docs/observability.md says
why): counters and histograms are plain Python objects whose `inc()` / `observe()` take a lock
and add a number, exemplars are native, and the exposition server is a thread of its own, so a
scrape never waits on the event loop.

Each process serves prometheus_client's default registry on a port of its own, never the public
one (`CUTY_<SERVICE>_METRICS_PORT`: gateway 9464, booking 9465, codepool 9466, payments 9467; 0
picks a free port). A service's metrics are a `Metrics` subclass: the process's instance lives
in the default registry; `SomeMetrics()` without a registry gets a private one, so a test that
runs several payments cores in one process counts each on its own.

Names follow Prometheus' rules: base units (`_seconds`), counters end in `_total`, and every
service's own metric starts with `cuty_<context>_`. RPC and route metrics follow OpenTelemetry's
semantic conventions as translated to Prometheus (`rpc_server_call_duration_seconds`,
`http_server_request_duration_seconds`; cutylib.grpc_metrics, gateway.access).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import uuid
from typing import Awaitable, Callable, Iterable

from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from .config import env_bool, env_float, env_int
from .periodic import periodic

log = logging.getLogger(__name__)

# Default metrics port of each process (README.md, "Configuration"); CUTY_<SERVICE>_METRICS_PORT overrides.
METRICS_PORTS = {"gateway": 9464, "booking": 9465, "codepool": 9466, "payments": 9467}

# Request durations, in seconds: 1 ms to 10 s (a PayCheckout waits on the PSP's answer). 20 ms is
# a bound of its own: availability's p99 target (docs/booking.md) reads off that bucket.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Lags and saga steps that may wait on a PSP or a retry: 10 ms to 5 min.
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def metrics_port_for(service: str) -> int:
    return env_int(f"CUTY_{service.upper()}_METRICS_PORT", METRICS_PORTS[service])


def metrics_enabled() -> bool:
    """CUTY_METRICS=off: no RPC histograms and no /metrics server (the benchmark's bare baseline)."""
    return env_bool("CUTY_METRICS", True)


def refresh_seconds() -> float:
    """How often gauges read from the database (stock, stuck sagas, backlogs) are refreshed."""
    return env_float("CUTY_METRICS_REFRESH_SECONDS", 15.0)


def start_metrics_server(service: str, port: int | None = None, *, host: str = "0.0.0.0",
                         registry: CollectorRegistry = REGISTRY) -> int:
    """Serve `/metrics` on a thread of its own; returns the port (the bound one when 0 was asked)."""
    port = metrics_port_for(service) if port is None else port
    server, _thread = start_http_server(port, addr=host, registry=registry)
    bound = server.server_port
    log.info("metrics listening", extra={"service": service, "metrics_port": bound})
    return bound


def trace_exemplar() -> dict[str, str] | None:
    """{"trace_id": ...} of the current span, for a histogram observation (None without one)."""
    ctx = trace.get_current_span().get_span_context()
    return {"trace_id": format(ctx.trace_id, "032x")} if ctx.is_valid else None


class Metrics:
    """Base of a service's metrics: its collectors, all in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()

    def counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> Counter:
        return Counter(name, doc, tuple(labels), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> Gauge:
        return Gauge(name, doc, tuple(labels), registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Iterable[str] = (), buckets=DURATION_BUCKETS) -> Histogram:
        return Histogram(name, doc, tuple(labels), registry=self.registry, buckets=buckets)

    def db_gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> Gauge:
        """A gauge read from the database (the same number in every replica): exported only while
        this process is the metrics leader (refresh_periodically with a MetricsLeader), so a
        `sum` over replicas counts it once."""
        if not hasattr(self, "_db_gauges"):
            self._db_gauges = _LeaderOnly()
            self.registry.register(self._db_gauges)
        gauge = Gauge(name, doc, tuple(labels), registry=None)
        self._db_gauges.gauges.append(gauge)
        return gauge

    def export_db_gauges(self, leader: bool) -> None:
        """Export the db_gauge()s or not; when not, their labelled values are dropped too, so a
        replica that becomes leader again exports nothing stale."""
        if hasattr(self, "_db_gauges"):
            self._db_gauges.export(leader)

    def value(self, sample: str, **labels: str) -> float:
        """The sum of the samples named `sample` (e.g. `cuty_payments_version_conflicts_total`)
        whose labels include `labels`: what tests and benchmarks read."""
        total = 0.0
        for family in self.registry.collect():
            for s in family.samples:
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total


class _LeaderOnly:
    """Collects its gauges only while exporting (a process that never elects, e.g. a test calling
    refresh directly, exports them)."""

    def __init__(self) -> None:
        self.gauges: list[Gauge] = []
        self.exporting = True

    def export(self, on: bool) -> None:
        self.exporting = on
        if not on:
            for g in self.gauges:
                if g._labelnames:
                    g.clear()

    def collect(self):
        if not self.exporting:
            return []
        return [m for g in self.gauges for m in g.collect()]


def _leader_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key per name."""
    return int.from_bytes(hashlib.sha256(f"cuty-metrics-leader:{name}".encode()).digest()[:8], "big", signed=True)


class MetricsLeader:
    """Which replica exports the gauges read from the database: the one holding a session-level
    advisory lock (pg_try_advisory_lock) on a connection it takes from the pool and keeps. Every
    other replica tries again each refresh, so when the leader dies (its session ends, the lock
    with it) another takes over within one refresh interval.

    The pool must reach PostgreSQL directly: behind PgBouncer in transaction mode a session lock
    stays on a server connection other clients then share, and two replicas could both lead
    (LeaseLeader is the election for such a pool)."""

    def __init__(self, pool, name: str) -> None:
        self.pool, self.key = pool, _leader_key(name)
        self._conn = None

    async def elect(self) -> bool:
        """Whether this process leads now (taking the lock if it is free)."""
        if self._conn is not None:
            try:
                await self._conn.fetchval("SELECT 1")  # the session that holds the lock still lives
                return True
            except Exception:
                log.warning("metrics leader connection lost", extra={"key": self.key})
                conn, self._conn = self._conn, None
                with contextlib.suppress(Exception):
                    await self.pool.release(conn)
        conn = await self.pool.acquire()
        try:
            if await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key):
                self._conn, conn = conn, None
                log.info("metrics leader", extra={"key": self.key})
                return True
            return False
        finally:
            if conn is not None:
                await self.pool.release(conn)

    async def resign(self) -> None:
        """Unlock and give the connection back (the pool's release does not unlock)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.execute("SELECT pg_advisory_unlock($1)", self.key)
            with contextlib.suppress(Exception):
                await self.pool.release(conn)


# Take the lease if it is free or expired, renew it if it is ours; no row back: another holds it.
# One statement (its own transaction), the database's clock: no session state, no clock skew.
_LEASE_ELECT = """
INSERT INTO metrics_leases AS l (name, holder, expires_at)
VALUES ($1, $2, now() + make_interval(secs => $3))
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at < now()
RETURNING holder"""
_LEASE_RESIGN = "DELETE FROM metrics_leases WHERE name = $1 AND holder = $2"


class LeaseLeader:
    """MetricsLeader's election for a pool behind PgBouncer in transaction mode: a lease row
    (table `metrics_leases`, the service's migrations) instead of a session lock. The leader renews
    it every refresh; when it stops renewing (dies, loses the database), another replica takes the
    lease once it has expired, `ttl` seconds after the last renewal (default: three refresh
    intervals). A leader that finds the lease taken over stops exporting at that round, so two
    replicas export at once for at most one refresh interval, and only after a leader stalled past
    its lease."""

    def __init__(self, pool, name: str, *, ttl: float | None = None, holder: str | None = None) -> None:
        self.pool, self.name = pool, name
        self.ttl = 3 * refresh_seconds() if ttl is None else ttl
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    async def elect(self) -> bool:
        """Whether this process leads now (taking, renewing or taking over the lease)."""
        return await self.pool.fetchval(_LEASE_ELECT, self.name, self.holder, float(self.ttl)) is not None

    async def resign(self) -> None:
        """Give the lease up at once (a clean stop): the next replica need not wait for it to expire."""
        with contextlib.suppress(Exception):
            await self.pool.execute(_LEASE_RESIGN, self.name, self.holder)


def observe(histogram, seconds: float) -> None:
    """Observe a duration with the current trace id as its exemplar (shown by Prometheus and
    Grafana next to the bucket: a slow request leads to its trace)."""
    histogram.observe(seconds, trace_exemplar())


class _PoolCollector:
    """asyncpg pool gauges, read at scrape time: size, in use, waiting for a connection."""

    def __init__(self) -> None:
        self.pools: dict[str, object] = {}

    def collect(self):
        size = GaugeMetricFamily("cuty_db_pool_connections", "Open connections in the pool", labels=["pool"])
        limit = GaugeMetricFamily("cuty_db_pool_max_connections", "The pool's maximum size", labels=["pool"])
        used = GaugeMetricFamily("cuty_db_pool_connections_in_use", "Connections handed out", labels=["pool"])
        waiting = GaugeMetricFamily("cuty_db_pool_waiting_requests", "Acquires waiting for a free connection",
                                    labels=["pool"])
        for name, pool in list(self.pools.items()):
            queue = getattr(pool, "_queue", None)
            if queue is None:  # closed
                continue
            # asyncpg keeps every holder not handed out in `_queue`; tasks blocked in acquire() wait
            # on the queue's getters (private to asyncio.Queue; no public count exists).
            max_size = pool.get_max_size()
            size.add_metric([name], pool.get_size())
            limit.add_metric([name], max_size)
            used.add_metric([name], max_size - queue.qsize())
            waiting.add_metric([name], sum(1 for f in getattr(queue, "_getters", ()) if not f.done()))
        return [size, limit, used, waiting]


_POOLS = _PoolCollector()
REGISTRY.register(_POOLS)


def register_pool(name: str, pool) -> None:
    """Export `pool`'s gauges as `cuty_db_pool_*{pool=name}`."""
    _POOLS.pools[name] = pool


async def refresh_periodically(refresh: Callable[[], Awaitable[None]], interval: float | None = None, *,
                               leader: MetricsLeader | None = None, metrics: Metrics | None = None) -> None:
    """Run `refresh()` (which sets gauges from the database) now and every `interval` seconds.

    With `leader`, only the elected replica refreshes and exports `metrics`' db_gauge()s; the
    others export none of them (every replica would report the same database, and a `sum` over
    replicas would count it N times).

    A background task: its queries start no trace (instrumentation is suppressed), so an idle
    stack exports no spans of its own bookkeeping. A failure is logged and retried next round."""
    def export(on: bool) -> None:
        if metrics is not None:
            metrics.export_db_gauges(on)

    async def round_() -> None:
        with suppress_instrumentation():
            if leader is None:
                await refresh()
                return
            try:
                leads = await leader.elect()
            except Exception:
                export(False)  # cannot tell: better absent (an alert) than counted twice
                raise
            if not leads:
                export(False)
                return
            await refresh()
            export(True)  # after the refresh: a new leader never exports values it did not read

    try:
        # Any failure: the gauges go stale for a round, nothing else.
        await periodic(round_, refresh_seconds() if interval is None else interval, what="metrics refresh", log=log,
                       retry_on=(Exception,))
    finally:
        if leader is not None:
            export(False)
            await leader.resign()
