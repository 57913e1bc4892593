"""Signed webhook delivery: at least once, retried with exponential backoff and jitter.

Each event has a unique id; every copy and every retry of one event carries that id (and the
same body), so receivers dedupe on it. Each attempt is signed afresh with the current time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from cutylib.backoff import equal_jitter

from . import signing
from .settings import Settings
from .state import new_id

log = logging.getLogger("pspsim.webhooks")

# Gap between the starts of the scrambled copies that race each other (WebhookDispatcher._scrambled).
SCRAMBLE_STAGGER_SECONDS = 0.003


@dataclass
class DeliveryStats:
    id: str
    type: str
    object_id: str
    intent_id: str  # the payment intent concerned (for a refund: its payment_intent)
    created: int
    copies: int = 0
    attempts: int = 0
    acknowledged: int = 0
    gave_up: int = 0
    last_status: int | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    body: bytes
    traceparent: str | None = None  # sent as the `traceparent` header: the delivery joins the payment's trace


class WebhookDispatcher:
    def __init__(self, settings: Settings, rng: random.Random | None = None):
        self.settings = settings
        self._client: aiohttp.ClientSession | None = None
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats: dict[str, DeliveryStats] = {}

    async def start(self) -> None:
        if self._client is None:
            # aiohttp rather than httpx: about a tenth of the CPU per delivery (docs/benchmarks.md).
            # Connections are kept alive; a burst past 32 in flight waits for one.
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.webhook_timeout_seconds),
                connector=aiohttp.TCPConnector(limit=32), skip_auto_headers=("User-Agent",))

    async def aclose(self) -> None:
        await self.cancel_all()
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def reset(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        self.stats.clear()

    # -- events --------------------------------------------------------------------------
    def event(self, type_: str, obj: dict[str, Any], *, idempotency_key: str | None = None,
              created: int | None = None, traceparent: str | None = None) -> Event:
        evt_id = new_id("evt")
        created = int(time.time()) if created is None else created
        payload = {
            "id": evt_id,
            "object": "event",
            "type": type_,
            "created": created,
            "data": {"object": obj},
            "request": {"idempotency_key": idempotency_key},
        }
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        intent_id = obj.get("payment_intent") if obj.get("object") in ("refund", "dispute") else obj.get("id")
        self.stats[evt_id] = DeliveryStats(id=evt_id, type=type_, object_id=obj.get("id", ""),
                                           intent_id=intent_id or "", created=created)
        return Event(evt_id, type_, body, traceparent)

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self, events: list[Event], *, copies: int = 1, scrambled: bool = False) -> None:
        """Deliver every event ``copies`` times in the background.

        ``events`` are in the order they happened. ``scrambled`` shuffles all copies, then
        puts a copy of the newest event first and a copy of the oldest last, so receivers
        always see a stale event after a newer one.
        """
        if copies <= 0 or not events:
            return
        base = self.settings.webhook_delay_ms / 1000.0
        plan = [e for e in events for _ in range(copies)]
        if scrambled:
            self._rng.shuffle(plan)
            if len(events) > 1:
                newest, oldest = events[-1], events[0]
                plan.remove(newest)
                plan.remove(oldest)
                plan = [newest, *plan, oldest]
        for event in plan:
            self.stats[event.id].copies += 1
        if scrambled:
            self._spawn(self._scrambled(plan, delay=base))
        else:
            for event in plan:
                self._spawn(self._run(event, delay=base))

    async def _scrambled(self, plan: list[Event], *, delay: float) -> None:
        """The first copy is answered before the others start, and the last starts once all the
        others were answered, so the receiver sees the newest event first and a stale one last
        however loaded the machine is (sends timed apart could overtake each other). The copies
        between race each other in flight, started SCRAMBLE_STAGGER_SECONDS apart. A copy whose
        first attempt fails is retried in the background, as any delivery is."""
        async def staggered(event: Event, pause: float) -> None:
            await asyncio.sleep(pause)
            await self._first_attempt(event)

        if delay > 0:
            await asyncio.sleep(delay)
        head, *middle = plan
        tail = middle.pop() if middle else None
        await self._first_attempt(head)
        await asyncio.gather(*(staggered(e, i * SCRAMBLE_STAGGER_SECONDS) for i, e in enumerate(middle)))
        if tail is not None:
            await self._first_attempt(tail)

    async def deliver_now(self, event: Event) -> bool:
        """Make the first attempt inline; if it fails, keep retrying in the background."""
        self.stats[event.id].copies += 1
        return await self._first_attempt(event)

    async def _first_attempt(self, event: Event) -> bool:
        """One attempt now; if it fails, the retries go on in the background."""
        if await self._attempt(event, 1):
            return True
        self._spawn(self._run(event, delay=self.backoff(1), first_attempt=2))
        return False

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- delivery ------------------------------------------------------------------------
    def backoff(self, attempt: int) -> float:
        """Sleep after failed attempt number ``attempt`` (1-based): equal jitter, capped."""
        s = self.settings
        return equal_jitter(attempt, s.webhook_retry_base_seconds, s.webhook_retry_cap_seconds, self._rng)

    async def _run(self, event: Event, *, delay: float, first_attempt: int = 1) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        attempt = first_attempt
        while not await self._attempt(event, attempt):
            if attempt >= self.settings.webhook_max_attempts:
                self.stats[event.id].gave_up += 1
                log.warning("webhook gave up", extra={"event_id": event.id, "event_type": event.type,
                                                      "attempts": attempt})
                return
            await asyncio.sleep(self.backoff(attempt))
            attempt += 1

    async def _attempt(self, event: Event, attempt: int) -> bool:
        assert self._client is not None, "dispatcher not started"
        st = self.stats.get(event.id)
        headers = {
            "Content-Type": "application/json",
            signing.HEADER: signing.sign(self.settings.webhook_secrets, event.body, int(time.time())),
            "User-Agent": "cuty-pspsim",
        }
        if event.traceparent:
            headers["traceparent"] = event.traceparent
        status: int | None = None
        error: str | None = None
        try:
            async with self._client.post(self.settings.webhook_url, data=event.body, headers=headers) as resp:
                status = resp.status
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        ok = status is not None and 200 <= status < 300
        if st is not None:
            st.attempts += 1
            st.last_status, st.last_error = status, error
            st.acknowledged += ok
        fields = {"event_id": event.id, "event_type": event.type, "attempt": attempt, "status": status}
        if ok:
            log.info("webhook delivered", extra=fields)
        else:
            log.warning("webhook attempt failed", extra={**fields, "error": error})
        return ok

    def snapshot(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self.stats.values()]
