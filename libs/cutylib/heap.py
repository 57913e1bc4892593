"""The cyclic garbage collector of a long-lived server process, set once it has built itself.

Everything built at start (imported modules, descriptors, routes, channels, OpenTelemetry) lives as
long as the process. Left in the collector's generations, every full collection rescans it: pauses
of 30-60 ms every few hundred milliseconds on a busy service, which were most of the p99 of a
request that allocates a lot (an availability answer of thousands of ids; bench/salon.py,
bench/gateway.py). `settle()` freezes that heap out of the collector and raises the young
generation's threshold, so requests' short-lived objects go in fewer, still small, passes.
Reference counting frees almost everything anyway; the collector only finds cycles.
"""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def settle() -> None:
    """Call once, when the process has built what it keeps and before it serves."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 20)
