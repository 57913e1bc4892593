"""Capped exponential backoff with equal jitter: the one rule for every retry loop.

After the n-th failure in a row the wait is drawn from [step / 2, step], step = min(cap, base * 2**(n-1)):
at least half the step, so a failing dependency is not hammered, and spread over the other half, so
replicas (or deliveries) retrying one outage do not retry in step.
"""
from __future__ import annotations

import random

# 2**30 * any sensible base is far past any cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT = 30


def equal_jitter(failures: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait after `failures` failures in a row (1 for the first; below 1 counts as 1)."""
    step = min(cap, base * 2 ** min(max(failures - 1, 0), _MAX_EXPONENT))
    return step * (0.5 + 0.5 * (rng or random).random())
