"""In-process counters for the payment paths (DESIGN.md, "Observability": version conflicts, deferred
finalizes, lease contention...). Per process; logged periodically and on shutdown."""
from __future__ import annotations

import asyncio
import logging
from collections import Counter

log = logging.getLogger(__name__)

VERSION_CONFLICTS = "version_conflicts"
DEFERRED_FINALIZES = "deferred_finalizes"
LEASE_TAKEOVERS = "lease_takeovers"
DUPLICATE_WEBHOOKS = "duplicate_webhooks"
RECONCILED_PAYMENTS = "reconciled_payments"
STALE_OBSERVATIONS = "stale_observations"
CONTRADICTIONS = "contradictions"
WEBHOOKS_REFUSED = "webhooks_refused"


class Metrics(Counter):
    """A Counter of named events; `inc()` reads better at call sites than `m[name] += 1`."""

    def inc(self, name: str, n: int = 1) -> None:
        self[name] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self)


REGISTRY = Metrics()


async def log_periodically(metrics: Metrics, interval: float = 60.0) -> None:
    last: dict[str, int] = {}
    while True:
        await asyncio.sleep(interval)
        now = metrics.snapshot()
        if now != last:
            log.info("payments metrics", extra={"metrics": now})
            last = now
