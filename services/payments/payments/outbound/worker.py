"""Delivery workers: claim due deliveries (FOR UPDATE SKIP LOCKED + a lease) and POST them.

Any number of replicas run this loop against one database. A claim leases a delivery for
`lease_seconds` (longer than the HTTP timeout), so no two workers POST one delivery at the same
time; a worker that dies mid-POST leaves the delivery due again when the lease runs out, so every
event reaches every subscribed endpoint at least once (receivers dedupe by Cuty-Event-Id). The end
of an attempt is written only while the lease is still ours, with its log row. A 2xx answer is
delivered; anything else is retried with exponential back-off and jitter until 3 days after the
event, then the delivery is `failed` (an admin may redeliver it). Nothing here blocks the saga:
the outbox rows are written by the state change, and delivery happens after the commit, here.

The endpoint is a merchant admin's choice, so its answer is untrusted input: only its status
counts, and at most MAX_ANSWER_BYTES of its body are read, as sent (no automatic decompression: a
gzip body of a few KiB may inflate to gigabytes), the whole attempt within the timeout.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass

import aiohttp
import asyncpg

from cutylib.config import env_field, env_float, env_int
from cutylib.telemetry import quiet

from .. import signature
from .repository import NOTIFY_CHANNEL, Claimed, Deliveries
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
    batch_size: int = env_field(env_int, "CUTY_WEBHOOK_BATCH_SIZE", 20)
    timeout_seconds: float = env_field(env_float, "CUTY_WEBHOOK_TIMEOUT_SECONDS", 5.0)
    # Longer than the timeout: nobody else claims a delivery while its POST may still be running.
    lease_seconds: float = env_field(env_float, "CUTY_WEBHOOK_LEASE_SECONDS", 30.0)
    # Back-off after failed attempt n: min(cap, base * 2**(n-1)), times a jitter in [0.5, 1].
    retry_base_seconds: float = env_field(env_float, "CUTY_WEBHOOK_RETRY_BASE_SECONDS", 10.0)
    retry_cap_seconds: float = env_field(env_float, "CUTY_WEBHOOK_RETRY_CAP_SECONDS", 3600.0)


def backoff(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds until the retry after failed attempt `attempt` (1-based): exponential, capped, with
    "equal jitter" so replicas retrying one failing receiver do not march in step."""
    full = min(cap, base * 2 ** min(max(attempt - 1, 0), 30))
    return full * (0.5 + 0.5 * (rng or random).random())


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


def new_client(options: DeliveryOptions) -> aiohttp.ClientSession:
    """The workers' HTTP client: every attempt within `timeout_seconds` in all (connect, send,
    answer), and answers taken as sent, never inflated (a Content-Encoding is not ours to undo)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=options.timeout_seconds), auto_decompress=False)


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
                 client: aiohttp.ClientSession | None = None, box: SecretBox | None = None):
        self.pool = pool
        self.deliveries = Deliveries(pool, box)
        self.worker_id = worker_id
        self.options = options or DeliveryOptions()
        self._client = client
        self._wake = asyncio.Event()

    async def run(self) -> None:
        """The background task (GrpcServer.add_background): listen, claim, POST, forever."""
        # aiohttp, as the PSP client (payments/psp.py): a fraction of httpx's CPU per POST.
        client = self._client or new_client(self.options)
        try:
            async with self._listening():
                while True:
                    self._wake.clear()
                    n = await self.run_once(client)
                    if n < self.options.batch_size:
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), self.options.poll_seconds)
        finally:
            if self._client is None:
                await client.close()

    async def run_once(self, client: aiohttp.ClientSession) -> int:
        """Claim one batch and deliver it; how many were claimed."""
        try:
            with quiet():
                claimed = await self.deliveries.claim_due(self.worker_id, self.options.batch_size,
                                                          self.options.lease_seconds)
        except TRANSIENT:
            log.warning("webhook delivery claim failed; retrying", exc_info=True)
            return 0
        await asyncio.gather(*(self._attempt(client, c) for c in claimed))
        return len(claimed)

    async def _attempt(self, client: aiohttp.ClientSession, c: Claimed) -> None:
        t0 = time.perf_counter()
        status, error = 0, ""
        try:
            if c.secret is None:  # nothing is sent unsigned or signed with a wrong key: retried, logged
                error = "the endpoint's stored secret failed its integrity check"
            else:
                async with client.post(c.url, data=c.payload, headers=headers(c), allow_redirects=False) as r:
                    # The status decides; a body that does not end in time is noted, not a failure.
                    status = r.status
                    await read_answer(r)
                if not 200 <= status < 300:
                    error = f"HTTP {status}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            error = f"{type(e).__name__}: {e}"[:500] or type(e).__name__
        ok = 200 <= status < 300
        took = int(1000 * (time.perf_counter() - t0))
        wait = 0.0 if ok else backoff(c.attempt, self.options.retry_base_seconds, self.options.retry_cap_seconds)
        try:
            state = await self.deliveries.finish(c, self.worker_id, delivered=ok, retry_in=wait, started_at=c.db_now,
                                                 http_status=status, error=error, duration_ms=took)
        except TRANSIENT:
            # The lease runs out and the delivery is due again: sent again (at least once).
            log.warning("webhook delivery result not recorded", exc_info=True, extra={"delivery_id": c.id})
            return
        log.info("webhook delivery attempt", extra={
            "delivery_id": c.id, "event_id": c.event_id, "event_type": c.event_type, "attempt": c.attempt,
            "http_status": status, "outcome": state or "lease-lost"})

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
