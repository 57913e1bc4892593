"""Delivery workers: claim due deliveries (fairly, under each merchant's and endpoint's cap, with a
lease) and POST them, each in a task of its own.

Any number of replicas run this loop against one database. The claim (repository.CLAIM_MERCHANTS,
CLAIM_DUE, REARM; it starts from the merchants with deliveries due, so it costs what is due, not
how many merchants subscribe) serves the merchants, and a merchant's endpoints, round robin; it
never lets one endpoint hold more than `endpoint_concurrency` leases nor one merchant more than
`merchant_concurrency`, whatever the number of workers, and skips an endpoint whose circuit is open. So a merchant whose
endpoints all hang holds a few slots of the cluster and the others keep being delivered. A claim
leases a delivery for `lease_seconds` (longer than the HTTP timeout), so no two workers POST one
delivery at the same time; a worker that dies mid-POST leaves the delivery due again when the lease runs out, so every
event reaches every subscribed endpoint at least once (receivers dedupe by Cuty-Event-Id). The end
of an attempt is written only while the lease is still ours, with its log row. A 2xx answer is
delivered; anything else is retried with exponential back-off and jitter until 3 days after the
event, then the delivery is `failed` (an admin may redeliver it). Nothing here blocks the saga:
the outbox rows are written by the state change, and delivery happens after the commit, here.

The endpoint is a merchant admin's choice, so its answer is untrusted input: only its status
counts, and at most MAX_ANSWER_BYTES of its body are read, as sent (no automatic decompression: a
gzip body of a few KiB may inflate to gigabytes), the whole attempt within the timeout. Its address
is untrusted too: the client connects only to public addresses, checked when connecting (egress.py),
and the log keeps a coarse error class (`timeout`, `http_503`, ...), never a socket's message.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import aiohttp
import asyncpg

from cutylib.config import env_bool, env_field, env_float, env_int, env_str
from cutylib.metrics import observe
from cutylib.telemetry import quiet
from cutylib.backoff import equal_jitter

from .. import signature
from .egress import ALLOW_PRIVATE, Egress, connector, error_class
from .metrics import OutboundMetrics, process_metrics
from .repository import NOTIFY_CHANNEL, Claimed, Deliveries, Limits
from .secrets import SecretBox

log = logging.getLogger(__name__)

USER_AGENT = "Cuty-Webhooks/1"
# What is read of an answer at the most: a short "ok" is read to its end (the connection is then
# reused); anything longer is cut off and its connection closed.
MAX_ANSWER_BYTES = 4096
TRANSIENT = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError)


@dataclass(frozen=True)
class DeliveryOptions:
    # Delivery worker loops this process runs: the payments process runs one by default; 0 where
    # the `payments-webhooks-out` Deployment delivers instead (python -m payments webhooks-out).
    workers: int = env_field(env_int, "CUTY_WEBHOOKS_OUT_WORKERS", 1)
    poll_seconds: float = env_field(env_float, "CUTY_WEBHOOK_POLL_SECONDS", 1.0)
    # At most this many deliveries per claim, and at most `concurrency` attempts running per worker
    # loop: each attempt is a task of its own, and the loop claims more as attempts end.
    batch_size: int = env_field(env_int, "CUTY_WEBHOOK_BATCH_SIZE", 20)
    concurrency: int = env_field(env_int, "CUTY_WEBHOOK_CONCURRENCY", 32)
    timeout_seconds: float = env_field(env_float, "CUTY_WEBHOOK_TIMEOUT_SECONDS", 5.0)
    # Longer than the timeout: nobody else claims a delivery while its POST may still be running.
    lease_seconds: float = env_field(env_float, "CUTY_WEBHOOK_LEASE_SECONDS", 30.0)
    # Back-off after failed attempt n: min(cap, base * 2**(n-1)), times a jitter in [0.5, 1].
    retry_base_seconds: float = env_field(env_float, "CUTY_WEBHOOK_RETRY_BASE_SECONDS", 10.0)
    retry_cap_seconds: float = env_field(env_float, "CUTY_WEBHOOK_RETRY_CAP_SECONDS", 3600.0)
    # One merchant's share of every worker of every replica (counted by the database: repository.Limits).
    endpoint_concurrency: int = env_field(env_int, "CUTY_WEBHOOK_ENDPOINT_CONCURRENCY", 4)
    merchant_concurrency: int = env_field(env_int, "CUTY_WEBHOOK_MERCHANT_CONCURRENCY", 8)
    # The circuit breaker per endpoint: open after this many failed attempts in a row, first for
    # `circuit_open_seconds`, doubled by each failed half-open probe up to `circuit_max_open_seconds`.
    circuit_failures: int = env_field(env_int, "CUTY_WEBHOOK_CIRCUIT_FAILURES", 5)
    circuit_open_seconds: float = env_field(env_float, "CUTY_WEBHOOK_CIRCUIT_OPEN_SECONDS", 30.0)
    circuit_max_open_seconds: float = env_field(env_float, "CUTY_WEBHOOK_CIRCUIT_MAX_OPEN_SECONDS", 600.0)
    # Loopback and private addresses, any port: local receivers in development and tests only
    # (egress.py; production refuses to start with it).
    allow_private: bool = env_field(env_bool, ALLOW_PRIVATE, False)

    def limits(self) -> Limits:
        return Limits(self.endpoint_concurrency, self.merchant_concurrency, self.circuit_failures,
                      self.circuit_open_seconds, self.circuit_max_open_seconds)

    def egress(self, environment: str | None = None) -> Egress:
        return Egress.from_env(environment or env_str("CUTY_ENV", "development"), self.allow_private)


def headers(c: Claimed, t: int | None = None) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        # The answer uncompressed, please: nothing here inflates it anyway (new_client).
        "Accept-Encoding": "identity",
        "Cuty-Event-Id": c.event_id,
        "Cuty-Event-Type": c.event_type,
        "Cuty-Delivery-Id": c.id,
        "Cuty-Signature": signature.sign(c.secret, c.payload, t),
    }


def new_client(options: DeliveryOptions, egress: Egress) -> aiohttp.ClientSession:
    """The workers' HTTP client: every attempt within `timeout_seconds` in all (connect, send,
    answer), answers taken as sent, never inflated (a Content-Encoding is not ours to undo), and
    connections only to the addresses `egress` allows, checked when connecting (egress.py)."""
    return aiohttp.ClientSession(connector=connector(egress, limit=max(options.concurrency, 1)),
                                 timeout=aiohttp.ClientTimeout(total=options.timeout_seconds), auto_decompress=False)


async def read_answer(r: aiohttp.ClientResponse, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """Up to `limit` bytes of the answer's body. An answer that ends within them leaves its
    connection for the next POST; a longer one (or one that never ends) is cut off: the
    connection is closed, so nothing more of it is read, buffered or waited for."""
    body = bytearray()
    while len(body) < limit:
        chunk = await r.content.read(limit - len(body))
        if not chunk:
            return bytes(body)
        body += chunk
    if not r.content.at_eof():
        r.close()
    return bytes(body)


class DeliveryWorker:
    def __init__(self, pool: asyncpg.Pool, worker_id: str, options: DeliveryOptions | None = None,
                 client: aiohttp.ClientSession | None = None, box: SecretBox | None = None,
                 metrics: OutboundMetrics | None = None, egress: Egress | None = None):
        self.pool = pool
        self.options = options or DeliveryOptions()
        self.deliveries = Deliveries(pool, box, self.options.limits())
        self.worker_id = worker_id
        self.egress = egress or self.options.egress()
        self.metrics = metrics or process_metrics()
        self._client = client
        self._wake = asyncio.Event()  # a NOTIFY, or an attempt ended (a slot is free)
        self._running: set[asyncio.Task] = set()

    async def run(self) -> None:
        """The background task (GrpcServer.add_background): listen, claim, POST, forever. Attempts
        run side by side, each in a task of its own with its own timeout: a slow endpoint holds
        its own slot, never the batch it came in."""
        # aiohttp, as the PSP client (payments/psp.py): a fraction of httpx's CPU per POST.
        client = self._client or new_client(self.options, self.egress)
        try:
            async with self._listening():
                while True:
                    # Cleared before claiming: a NOTIFY or an attempt ending meanwhile keeps it set.
                    self._wake.clear()
                    free = min(self.options.batch_size, self.options.concurrency - len(self._running))
                    claimed = await self.claim_and_start(client, free) if free > 0 else 0
                    if free <= 0 or claimed < free:
                        await self._woken(self.options.poll_seconds)
        finally:
            for t in list(self._running):
                t.cancel()  # their leases run out: delivered again by whoever claims them (at least once)
            await asyncio.gather(*self._running, return_exceptions=True)
            if self._client is None:
                await client.close()

    async def _woken(self, timeout: float) -> None:
        """Until a wake-up or `timeout`. Not `asyncio.wait_for`: on Python 3.11 it swallows a
        cancellation that lands as the event is set, and attempts set it all the time, so
        stopping the worker could be lost."""
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

    async def run_once(self, client: aiohttp.ClientSession) -> int:
        """Claim one batch and deliver it (tests); how many were claimed."""
        n = await self.claim_and_start(client, self.options.batch_size)
        await asyncio.gather(*self._running, return_exceptions=True)
        return n

    async def claim_and_start(self, client: aiohttp.ClientSession, limit: int) -> int:
        """Claim up to `limit` due deliveries and start an attempt for each; how many were claimed."""
        try:
            with quiet():
                claimed = await self.deliveries.claim_due(self.worker_id, limit, self.options.lease_seconds)
        except TRANSIENT:
            log.warning("webhook delivery claim failed; retrying", exc_info=True)
            return 0
        for c in claimed:
            task = asyncio.create_task(self._attempt(client, c), name=f"webhook-delivery:{c.id}")
            self._running.add(task)
            task.add_done_callback(self._ended)
        return len(claimed)

    def _ended(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._wake.set()

    async def _post(self, client: aiohttp.ClientSession, c: Claimed) -> tuple[int, str]:
        """(HTTP status or 0, error class or "") of one POST, within the attempt's timeout."""
        if c.secret is None:  # nothing is sent unsigned or signed with a wrong key: retried, logged
            return 0, "secret_unusable"
        status = 0
        try:
            # The session's total timeout bounds the request; this bounds everything else too.
            async with asyncio.timeout(self.options.timeout_seconds):
                async with client.post(c.url, data=c.payload, headers=headers(c), allow_redirects=False) as r:
                    # The status decides; a body that does not end in time is noted, not a failure.
                    status = r.status
                    await read_answer(r)
        except Exception as e:  # noqa: BLE001 - whatever happened is one coarse class in the log
            error = error_class(e)
            if error == "error":
                log.warning("webhook delivery failed unexpectedly", exc_info=True, extra={"delivery_id": c.id})
            if status and not 200 <= status < 300:
                return status, f"http_{status}"
            return status, error
        return status, "" if 200 <= status < 300 else f"http_{status}"

    async def _attempt(self, client: aiohttp.ClientSession, c: Claimed) -> None:
        t0 = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            status, error = await self._post(client, c)
        finally:
            self.metrics.in_flight.dec()
        ok = 200 <= status < 300
        took = time.perf_counter() - t0
        observe(self.metrics.duration, took)
        wait = 0.0 if ok else equal_jitter(c.attempt, self.options.retry_base_seconds, self.options.retry_cap_seconds)
        try:
            done = await self.deliveries.finish(c, self.worker_id, delivered=ok, retry_in=wait, started_at=c.db_now,
                                                http_status=status, error=error, duration_ms=int(1000 * took))
        except TRANSIENT:
            # The lease runs out and the delivery is due again: sent again (at least once).
            log.warning("webhook delivery result not recorded", exc_info=True, extra={"delivery_id": c.id})
            done = None
        outcome = "lease_lost" if done is None else {"pending": "retrying"}.get(done.state, done.state)
        self.metrics.deliveries.labels(outcome, error).inc()
        if done is not None and done.circuit_opened:
            self.metrics.circuits_opened.inc()
            log.warning("webhook endpoint circuit opened", extra={
                "merchant_id": c.merchant_id, "endpoint_id": c.endpoint_id, "error": error})
        log.info("webhook delivery attempt", extra={
            "delivery_id": c.id, "event_id": c.event_id, "event_type": c.event_type, "attempt": c.attempt,
            "http_status": status, "error": error, "outcome": outcome})

    @contextlib.asynccontextmanager
    async def _listening(self):
        """LISTEN for the outbox trigger's NOTIFY (sent at the commit of a state change with
        events): new events go out at once; polling is the safety net (and drives retries)."""
        conn = None
        with contextlib.suppress(*TRANSIENT):
            conn = await self.pool.acquire()

        def on_notify(*_args) -> None:
            self._wake.set()

        try:
            if conn is not None:
                with contextlib.suppress(*TRANSIENT), quiet():
                    await conn.add_listener(NOTIFY_CHANNEL, on_notify)
            yield
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.remove_listener(NOTIFY_CHANNEL, on_notify)
                await self.pool.release(conn)
