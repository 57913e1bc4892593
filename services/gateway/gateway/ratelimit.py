"""Token buckets per key: the gateway keeps one table per client address (before any token is
looked at) and one per verified token subject (app.py), so one noisy client cannot starve the rest
and made-up tokens get no fresh bursts.

In memory and per gateway replica: with N replicas behind a balancer a customer gets up to N
times the rate, which is fine for a guard against runaway clients (it is not a quota).
"""
from __future__ import annotations

import math
import time


class RateLimiter:
    def __init__(self, rate_per_second: float, burst: float, *, max_keys: int = 100_000, clock=time.monotonic):
        self.rate = rate_per_second
        self.burst = max(burst, 1.0)
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, key: str) -> float:
        """0 when the request may proceed, else the seconds to wait before one more is allowed."""
        if not self.enabled:
            return 0.0
        now = self._clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > self.max_keys:
                self._prune(now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def _prune(self, now: float) -> None:
        # A bucket that has refilled completely carries no state worth keeping.
        full = [k for k, (t, last) in self._buckets.items() if t + (now - last) * self.rate >= self.burst]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) > self.max_keys:  # still too many: drop the oldest half
            for k in sorted(self._buckets, key=lambda k: self._buckets[k][1])[: len(self._buckets) // 2]:
                del self._buckets[k]


def retry_after_header(wait_seconds: float) -> str:
    """Retry-After is whole seconds (RFC 9110); round up so a client that obeys gets through."""
    return str(max(1, math.ceil(wait_seconds)))
