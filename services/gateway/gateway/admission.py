"""Admission control: an adaptive limit on the backend calls the gateway has in flight.

Past the backends' capacity, every call admitted only queues behind the others: all answers get
slow, buyers give up, and the services keep working for buyers who left. So the gateway keeps at
most `limit` calls in flight and answers the rest quickly with `503 overloaded` and a
`Retry-After`; the only queue is the short bounded wait below.

The limit follows the throughput the backends deliver, not a latency target (the 2-core stack
completes more checkouts a second with more calls in flight well past 16, its CPU per checkout
falling as per-wakeup and per-commit costs are shared, so a latency target that every call missed
held the limit at its minimum and left that throughput unused). It is found by probing, as TCP
BBR probes for bandwidth and Netflix's concurrency-limits for a limit:

- each route's *no-load latency* is the minimum latency of its successful calls over the last one
  to two BASELINE_SECONDS (a route is compared with itself: a pay waits on the PSP, a list does
  not; an error answer, often quick, is not a sample of it);
- throughput is measured as *delivered concurrency*: the sum of the no-load latencies of the calls
  that ended, over the time they ended in (the calls in flight the backends would have needed
  without any queueing; unlike a count of calls it does not move with the mix of routes), over at
  least EPOCH_SECONDS and EPOCH_CALLS calls, counted only once the calls in flight at the limit's
  last change have ended (one smoothed mean latency, at most EPOCH_SECONDS);
- the limit's base is measured, then a probe at GROWTH x the base, then the base again; the probe
  is judged against the mean of the two base measurements around it (a drift in what the machine
  leaves the platform, other work or a changing mix, is not taken for the probe's effect). A probe
  up is kept when throughput rose by MIN_GAIN (more in flight, more done), and the next probe goes
  higher; otherwise the next probe goes GROWTH times lower, and is kept while throughput falls by
  less than MIN_GAIN (as much done with less in flight: less latency). So the limit grows while
  throughput grows, and is cut when latency rises without throughput rising (Little's law: more in
  flight at the same throughput is only waiting); it settles at the knee of the throughput curve;
- when the base delivers COLLAPSE less than at its last measurement, the platform's capacity fell
  (other work on its cores, a slow dependency): the limit falls in the same proportion at once,
  so that the calls in flight keep their latency, and the probing starts again;
- it moves only while demand meets it (in most windows of the measurement a request waited or was
  refused, or the calls in flight reached new work's share): an idle limit says nothing;
- a backend's RESOURCE_EXHAUSTED or UNAVAILABLE, or a DEADLINE_EXCEEDED of a call that ran past
  max(target, tolerance x its no-load latency) (a client's own short Request-Timeout is no sign of
  overload), cuts the limit by BACKOFF at once (at most once per window) and restarts the probing;
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
A request waits only when a place is likely to free for it within its wait: when as many waiters
of its criticality or a higher one are already ahead of it as places freed in the last window's
rate over that wait, it is refused at once (its wait would end in a refusal anyway, only later).
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
# A probe of the limit measures throughput over at least EPOCH_SECONDS and EPOCH_CALLS calls (one
# window of ~20 calls is noise), after the calls in flight at its change have ended.
EPOCH_SECONDS = 0.5
EPOCH_CALLS = 100
GROWTH = 1.25  # a probe moves the limit by this factor (at least 1), up or down
MIN_GAIN = 0.1  # a probe up (x GROWTH) is kept when throughput rose by this much; down when it fell by less
BACKOFF = 0.8  # a backend's sign of overload
# The base delivering this much less than at its last measurement: the platform's capacity fell,
# and the limit falls in proportion at once (probing down x1/1.25 per two measurements is too slow).
COLLAPSE = 0.3
NORMAL_SHARE = 0.75
SHEDDABLE_SHARE = 0.5
CRITICAL_HEADROOM = 0.1
# A queue of waiters not empty for this long is standing (CoDel's interval).
QUEUE_INTERVAL = 0.1
# Retry-After of a refusal, whole seconds, drawn in this range so that refused clients do not all
# come back in the same second.
RETRY_AFTER = (1, 3)

# How a call ended, for the limit: answered, a backend's sign of overload, its deadline, or answered
# with an error (a completion, but no sample of the route's no-load latency: a refusal is often quick).
OK, OVERLOAD, TIMEOUT, ERROR = 0, 1, 2, 3


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
        self._rtt = 0.0  # the calls' mean latency, smoothed (how long a limit's change takes to show)
        self._peak = 0  # the most calls in flight in this window
        self._pressed = False  # a request of this window waited or was refused
        self._frees = 0  # places given up in this window
        # The current probe's measurement: no-load seconds delivered, calls, windows, windows pressed, start.
        self._epoch: list = [0.0, 0, 0, 0, now]
        self._settle_until = now  # a change of the limit shows in throughput only after the calls then in flight end
        # The probing: the limit it is based on, that base's last measurement (None: not measured
        # yet), the probe's direction (+1 / -1) and its measurement (None: not probed yet).
        self._base, self._base_rate, self._direction = self.limit, None, +1
        self._probe_rate: float | None = None
        self.free_rate: float | None = None  # places freed per second, last window (None: not measured yet)
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

    def _ahead(self, criticality: str) -> int:
        """Waiters a request of this criticality would wait behind: its own and higher ones."""
        if criticality == CRITICAL:
            return len(self._waiting[CRITICAL])
        if criticality == NORMAL:
            return len(self._waiting[CRITICAL]) + len(self._waiting[NORMAL])
        return self.queued

    async def acquire(self, criticality: str, budget: float) -> bool:
        """`admit`, or else wait for a freed place, at most `max_wait` and `budget` seconds; True:
        the call may start, and `release` (or `cancel`) must follow it. False: refuse it now."""
        if self.admit(criticality):
            return True
        self._pressed = True
        wait = min(self.max_wait(criticality), budget)
        # New work and reads may fill half the queue: the rest stays for purchases under way.
        if wait <= 0 or self.queued >= (self.queue_max if criticality == CRITICAL else self.queue_max // 2):
            return False
        # No place is likely to free for it within its wait: refused now rather than after the wait.
        ahead = self._ahead(criticality)
        if ahead and self.free_rate is not None and ahead >= self.free_rate * wait:
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
        self._frees += 1
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
        if outcome == OK:
            if base is None:
                base = self._baselines[route] = [rtt, rtt, now]
            elif now - base[2] >= BASELINE_SECONDS:
                base[1], base[0], base[2] = base[0], rtt, now
            elif rtt < base[0]:
                base[0] = rtt
        no_load = min(base[0], base[1], rtt) if base else rtt
        self._epoch[0] += no_load
        self._epoch[1] += 1
        self._rtt += (rtt - self._rtt) * 0.05
        if outcome == OVERLOAD or (outcome == TIMEOUT and rtt > self.target and rtt > self.tolerance * no_load):
            self._cut(now)
        if now - self._window_start >= WINDOW_SECONDS:
            self._close_window(now)

    def no_load_latency(self, route: str) -> float | None:
        """The route's no-load latency now (seconds), None before its first successful call."""
        base = self._baselines.get(route)
        return min(base[0], base[1]) if base else None

    def _cut(self, now: float) -> None:
        if now - self._last_cut < WINDOW_SECONDS:
            return  # one cut per window: a burst of refusals is one sign, not many
        self._last_cut = now
        self._set_limit(max(self.min_limit, min(self.limit - 1, int(self.limit * BACKOFF))))
        self._restart(now)

    def _close_window(self, now: float) -> None:
        self.free_rate = self._frees / (now - self._window_start)
        if now < self._settle_until:  # the calls admitted before the last change are still ending
            self._epoch = [0.0, 0, 0, 0, now]
        else:
            self._epoch[2] += 1
            self._epoch[3] += self._pressed or self._peak >= self._caps[NORMAL]
        self._window_start = now
        self._frees, self._pressed = 0, False
        self._peak = self.in_flight
        e = self._epoch
        if now - e[4] >= EPOCH_SECONDS and (e[1] >= EPOCH_CALLS or now - e[4] >= 4 * EPOCH_SECONDS):
            self._close_epoch(now)

    def _close_epoch(self, now: float) -> None:
        """A measurement ended: the base's, or the probe's. A probe is judged against the mean of
        the base's measurements before and after it, so that a slow drift in what the machine
        leaves the platform (other work, a changing mix) is not taken for the probe's effect."""
        work, _, windows, pressed, start = self._epoch
        self._epoch = [0.0, 0, 0, 0, now]
        rate = work / (now - start)  # delivered concurrency over the measurement
        if pressed * 2 < windows or self._last_cut >= start:
            self._restart(now)  # demand did not meet the limit, or a backend cut it: nothing learnt
            return
        if self.limit != self._base:  # the probe measured: back to the base, to measure it again
            self._probe_rate = rate
            self._set_limit(self._base)
            self._settle(now)
            return
        if self._base_rate is not None and rate < self._base_rate * (1 - COLLAPSE):
            # The same limit delivers far less than it did (the platform's capacity fell: other
            # work on its cores, a slow dependency): the limit falls with it at once, so that the
            # calls in flight keep their latency, and the probing starts again from there.
            self._set_limit(max(self.min_limit, min(self._base - 1, math.ceil(self._base * rate / self._base_rate))))
            self._restart(now)
            return
        if self._base_rate is None or self._probe_rate is None:
            self._base_rate = rate  # the base measured (before any probe)
        else:
            ref, probed = (self._base_rate + rate) / 2, self._probe_limit()
            if self._direction > 0 and self._probe_rate >= ref * (1 + MIN_GAIN):
                self._base, rate = probed, self._probe_rate  # more in flight, more done: keep it
            elif self._direction < 0 and self._probe_rate >= ref * (1 - MIN_GAIN):
                self._base, rate = probed, self._probe_rate  # less in flight, as much done: keep it
            else:
                # Up, and not more done (only more latency): try down; down, and less done: try up.
                self._direction = -self._direction
            self._base_rate, self._probe_rate = rate, None
            self._set_limit(self._base)
        probed = self._probe_limit()
        if probed == self._base:  # at a bound: the other way
            self._direction = -self._direction
            probed = self._probe_limit()
        if probed != self._base:
            self._set_limit(probed)
        self._settle(now)

    def _probe_limit(self) -> int:
        if self._direction > 0:
            return min(self.max_limit, max(self._base + 1, int(self._base * GROWTH)))
        return max(self.min_limit, min(self._base - 1, math.ceil(self._base / GROWTH)))

    def _restart(self, now: float) -> None:
        """The probing starts again from the limit as it is now (after a cut, or when demand fell
        away: a probe above the base that nobody pressed is undone)."""
        if self.limit > self._base and self._last_cut < now:
            self._set_limit(self._base)
        self._base, self._base_rate, self._probe_rate, self._direction = self.limit, None, None, +1
        self._settle(now)

    def _settle(self, now: float) -> None:
        # At most EPOCH_SECONDS: after a cut the calls in flight drain at the old throughput, which
        # only makes a lower limit look no worse (the safe way to err).
        self._settle_until = now + min(self._rtt, EPOCH_SECONDS)
        self._epoch = [0.0, 0, 0, 0, now]


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
