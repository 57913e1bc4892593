"""Crash injection by configuration, for the crash-matrix test (tests/e2e/checkout/test_crash_matrix.py).

`CUTY_CRASH_AT=confirm:before` makes the orchestrator SIGKILL itself just before the saga's confirm
step calls booking / the code pool; `confirm:after` just after the call answered and before the
saga row records it; `recorded:<STATE>` (e.g. `recorded:COMPLETED`) just after the saga row's move to
that state committed (with the merchant events its trigger wrote, issue 12). SIGKILL, not an exception: nothing gets to clean up, as in a real crash.
Unset in production; the check is one set lookup.
"""
from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

_points: frozenset[str] = frozenset()


def configure(spec: str) -> None:
    global _points
    _points = frozenset(p.strip() for p in spec.split(",") if p.strip())
    if _points:
        log.warning("crash injection armed", extra={"crash_at": ",".join(sorted(_points))})


def point(name: str) -> None:
    if name in _points:
        log.warning("crash injection: SIGKILL", extra={"crash_point": name})
        for h in logging.getLogger().handlers:
            h.flush()
        os.kill(os.getpid(), signal.SIGKILL)
