"""Admission control: an adaptive limit on the backend calls the gateway has in flight.

Past the backends' capacity, every call admitted only queues behind the others: all answers get
slow, buyers give up, and the services keep working for buyers who left. So the gateway keeps at
most `limit` calls in flight and answers the rest at once with `503 overloaded` and a
`Retry-After`; there is no queue.

The limit is found by AIMD on the calls' latency (as Netflix's concurrency-limits and Envoy's
adaptive concurrency filter do), evaluated per window of WINDOW_SECONDS:

- a call is *slow* when it took longer than max(target, tolerance x its route's recent minimum
  latency): routes differ (a pay waits on the PSP, a list does not), so each is compared with
  itself; the minimum is kept over the last one to two BASELINE_SECONDS, so it follows a
  deployment that made a route slower for good;
- a window whose calls were mostly slow cuts the limit by BACKOFF; so does, at once, a backend's
  RESOURCE_EXHAUSTED or UNAVAILABLE, or a DEADLINE_EXCEEDED of a call that ran past its target (a
  client's own short Request-Timeout is no sign of overload); at most one cut per window;
- a window without a cut in which at least half the limit was used grows the limit by one;
- the limit stays within [min_limit, max_limit].

Criticality (policy.LOAD): new work (NORMAL) may use NORMAL_SHARE of the limit, reads that can be
asked again (SHEDDABLE) SHEDDABLE_SHARE, so they are refused first; the work that finishes a
purchase already started (CRITICAL) may use all of it plus CRITICAL_HEADROOM.

A short, bounded wait instead of an instant refusal (`acquire`): arrivals come in bursts, and a
place frees every few milliseconds at capacity, so refusing whoever finds the places taken loses
buyers the platform could have served a moment later (at an offered load equal to capacity, a
third of them). A request that finds its share in use waits for a freed place, at most
`queue_seconds` (new work and reads) or `critical_queue_seconds` (a purchase under way, which is
refused only when not even that wait frees a place), and at most `queue_max` requests wait at
once (new work and reads at most half of them). A freed place goes to the oldest waiter of the highest criticality whose share allows it.
As CoDel does, a queue that has not been empty for QUEUE_INTERVAL is standing (sustained overload,
not a burst): new work then waits at most `queue_target_seconds`, so its refusal stays quick.

One instance per gateway process, used from its event loop only (no locks); every table in it is
bounded (one baseline per route).
"""
from __future__ import annotations

import asyncio
import math
import random
import time
import weakref
from collections import deque

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from .policy import CRITICAL, NORMAL, SHEDDABLE

WINDOW_SECONDS = 0.1
BASELINE_SECONDS = 30.0
BACKOFF = 0.8
NORMAL_SHARE = 0.75
SHEDDABLE_SHARE = 0.5
CRITICAL_HEADROOM = 0.1
# A queue of waiters not empty for this long is standing (CoDel's interval).
QUEUE_INTERVAL = 0.1
# Retry-After of a refusal, whole seconds, drawn in this range so that refused clients do not all
# come back in the same second.
RETRY_AFTER = (1, 3)

# How a call ended, for the limit: answered (whatever the answer), a backend's sign of overload,
# or its deadline.
OK, OVERLOAD, TIMEOUT = 0, 1, 2


class AdmissionControl:
    def __init__(self, *, min_limit: int, max_limit: int, initial_limit: int, tolerance: float,
                 target_seconds: float, queue_seconds: float = 0.0, queue_target_seconds: float = 0.0,
                 critical_queue_seconds: float = 0.0, queue_max: int = 0, clock=time.monotonic):
        # max_limit 0 turns admission control off: every call is admitted.
        self.enabled = max_limit > 0
        self.min_limit = max(1, min_limit)
        self.max_limit = max(self.min_limit, max_limit)
        self.tolerance = tolerance
        self.target = target_seconds
        self.clock = clock
        self.in_flight = 0
        self.limit = 0
        self._caps: dict[str, float] = {}
        self._set_limit(min(self.max_limit, max(self.min_limit, initial_limit)))
        self._baselines: dict[str, list[float]] = {}  # route -> [this period's min, last period's, period start]
        now = clock()
        self._window_start = now
        self._last_cut = -math.inf
        self._samples = self._slow = self._peak = 0
        self.queue_seconds, self.queue_target = queue_seconds, min(queue_target_seconds, queue_seconds)
        self.critical_queue_seconds, self.queue_max = critical_queue_seconds, queue_max
        # Waiters per criticality, oldest first; each is answered True (a place) or False.
        self._waiting: dict[str, deque[asyncio.Future]] = {CRITICAL: deque(), NORMAL: deque(), SHEDDABLE: deque()}
        self.queued = 0
        self._empty_since = now  # when the queue was last empty
        _LIVE.add(self)

    def _set_limit(self, limit: int) -> None:
        self.limit = limit
        if not self.enabled:
            self._caps = {CRITICAL: math.inf, NORMAL: math.inf, SHEDDABLE: math.inf}
            return
        self._caps = {CRITICAL: limit + max(1, math.ceil(limit * CRITICAL_HEADROOM)),
                      NORMAL: max(1, int(limit * NORMAL_SHARE)), SHEDDABLE: max(1, int(limit * SHEDDABLE_SHARE))}

    def cap(self, criticality: str) -> float:
        """How many calls may be in flight when one of this criticality is admitted."""
        return self._caps.get(criticality, self._caps[SHEDDABLE])

    def admit(self, criticality: str) -> bool:
        """True: the call may start, and `release` must follow it. False: refuse it now."""
        if self.in_flight >= self._caps.get(criticality, self._caps[SHEDDABLE]):
            return False
        self.in_flight += 1
        if self.in_flight > self._peak:
            self._peak = self.in_flight
        return True

    def max_wait(self, criticality: str) -> float:
        """How long a request of this criticality may wait for a place now (0: refuse at once)."""
        if criticality == CRITICAL:
            return self.critical_queue_seconds
        if self.queued and self.clock() - self._empty_since >= QUEUE_INTERVAL:
            return self.queue_target  # a standing queue: sustained overload
        return self.queue_seconds

    async def acquire(self, criticality: str, budget: float) -> bool:
        """`admit`, or else wait for a freed place, at most `max_wait` and `budget` seconds; True:
        the call may start, and `release` (or `cancel`) must follow it. False: refuse it now."""
        if self.admit(criticality):
            return True
        wait = min(self.max_wait(criticality), budget)
        # New work and reads may fill half the queue: the rest stays for purchases under way.
        if wait <= 0 or self.queued >= (self.queue_max if criticality == CRITICAL else self.queue_max // 2):
            return False
        if not self.queued:
            self._empty_since = self.clock()
        fut = asyncio.get_running_loop().create_future()
        waiters = self._waiting.get(criticality, self._waiting[SHEDDABLE])
        waiters.append(fut)
        self.queued += 1
        timer = fut.get_loop().call_later(wait, self._expire, fut, waiters)
        try:
            return await fut
        except asyncio.CancelledError:
            # The client left while waiting: a place handed over in the meantime is given back.
            if fut.done() and not fut.cancelled() and fut.result():
                self.cancel()
            else:
                self._unqueue(fut, waiters)
            raise
        finally:
            timer.cancel()

    def _expire(self, fut: asyncio.Future, waiters: deque) -> None:
        if not fut.done():
            self._unqueue(fut, waiters)
            fut.set_result(False)

    def _unqueue(self, fut: asyncio.Future, waiters: deque) -> None:
        try:
            waiters.remove(fut)  # at most queue_max long
        except ValueError:
            return
        self._dequeued()

    def _dequeued(self) -> None:
        self.queued -= 1
        if not self.queued:
            self._empty_since = self.clock()

    def _free_place(self) -> None:
        """A place is given up: it passes to the first waiter whose share allows it, else it is free."""
        if self.queued:
            for criticality in (CRITICAL, NORMAL, SHEDDABLE):
                waiters = self._waiting[criticality]
                while waiters and self.in_flight - 1 < self._caps[criticality]:
                    fut = waiters.popleft()
                    self._dequeued()
                    if not fut.done():  # (one cancelled with its client is skipped)
                        fut.set_result(True)  # in_flight unchanged: the place is the waiter's now
                        return
        self.in_flight -= 1

    def cancel(self) -> None:
        """The end of an admitted request that never called a backend (refused by a later check:
        its token, its body): its place is given back, and it is no latency sample."""
        self._free_place()

    def release(self, route: str, started: float, outcome: int = OK) -> None:
        """The end of an admitted call of `route` that started at `started` (this clock)."""
        self._free_place()
        if not self.enabled:
            return
        now = self.clock()
        rtt = now - started
        base = self._baselines.get(route)
        if base is None:
            base = self._baselines[route] = [rtt, rtt, now]
        elif now - base[2] >= BASELINE_SECONDS:
            base[1], base[0], base[2] = base[0], rtt, now
        elif rtt < base[0]:
            base[0] = rtt
        slow = rtt > self.target and rtt > self.tolerance * min(base[0], base[1])
        if outcome == OVERLOAD or (outcome == TIMEOUT and slow):
            self._cut(now)
        self._samples += 1
        if slow:
            self._slow += 1
        if now - self._window_start >= WINDOW_SECONDS:
            self._close_window(now)

    def _cut(self, now: float) -> None:
        if now - self._last_cut < WINDOW_SECONDS:
            return  # one cut per window: a burst of refusals is one sign, not many
        self._last_cut = now
        self._set_limit(max(self.min_limit, min(self.limit - 1, int(self.limit * BACKOFF))))

    def _close_window(self, now: float) -> None:
        if self._slow * 2 > self._samples:
            self._cut(now)
        elif self._last_cut < self._window_start and self._peak * 2 >= self.limit and self.limit < self.max_limit:
            self._set_limit(self.limit + 1)
        self._window_start = now
        self._samples = self._slow = 0
        self._peak = self.in_flight


def retry_after() -> str:
    return str(random.randint(*RETRY_AFTER))


# The process's gauges, read at scrape time (nothing on the request path): summed over the
# controllers alive in this process (one per gateway; tests may run several).
_LIVE: "weakref.WeakSet[AdmissionControl]" = weakref.WeakSet()


class _Collector:
    def collect(self):
        limit = GaugeMetricFamily("cuty_gateway_concurrency_limit",
                                  "Backend calls the gateway admits at once now (adaptive; admission.py)")
        in_flight = GaugeMetricFamily("cuty_gateway_calls_in_flight", "Backend calls the gateway has in flight")
        live = list(_LIVE)
        limit.add_metric([], sum(c.limit for c in live if c.enabled))
        in_flight.add_metric([], sum(c.in_flight for c in live))
        yield limit
        yield in_flight


REGISTRY.register(_Collector())
