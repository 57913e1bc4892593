"""In-process counters (DESIGN.md, "Observability"). Each service names its own counters and keeps
one registry per process; counters are logged when they change."""
from __future__ import annotations

import asyncio
import logging
from collections import Counter

log = logging.getLogger(__name__)


class Metrics(Counter):
    """A Counter of named events; `inc()` reads better at call sites than `m[name] += 1`."""

    def inc(self, name: str, n: int = 1) -> None:
        self[name] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self)


async def log_periodically(metrics: Metrics, what: str, interval: float = 60.0) -> None:
    """Log `metrics` every `interval` seconds when they changed (a background task)."""
    last: dict[str, int] = {}
    while True:
        await asyncio.sleep(interval)
        now = metrics.snapshot()
        if now != last:
            log.info("%s metrics", what, extra={"metrics": now})
            last = now
