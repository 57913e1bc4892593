"""Crash injection by configuration, for the crash-matrix tests (tests/e2e/checkout/).

A process arms named points with `configure("confirm:before,recorded:COMPLETED")` (the payments
service reads `CUTY_CRASH_AT`); `point(name)` at an armed point SIGKILLs the process. The checkout
saga names its points `<step>:before` / `<step>:after` around each remote call and
`recorded:<STATE>` right after a move committed; the payments core names `psp_refund:before|after`
around the PSP's refund call. SIGKILL, not an exception: nothing gets to clean up, as in a real
crash. Unarmed in production (`CUTY_CRASH_AT` is a test hook production refuses); the check is one
set lookup.
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
