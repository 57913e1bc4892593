"""The gateway's admission policy alone (`make bench-admission`): goodput past capacity in front of a
model backend that behaves like the 2-core stack, the adaptive limit against a limit fixed at the
old floor.

`make bench-overload` measures the whole platform, but on a machine shared with other work its
wall-clock goodput moves by more between runs of the same code than between policies. This
isolates the policy: the gateway's real `AdmissionControl` admits each call (its settings'
defaults, the short wait for a freed place included), in front of a model of the platform, in
virtual time (asyncio sleeps jump to the next timer: other work on the machine does not move the
figures and every run gives the same ones).

The model (what `make bench-checkout` and `make bench-overload` showed of the real stack):
- CORES cores, taken first come first served, do all the work; a call holds a core for its CPU
  burst, then waits IO_MS of its checkout's share (the PSP, the network) without one;
- a checkout costs CPU_MS + AMORTISED_MS / (c + 14) ms of CPU with c calls in flight when it starts
  (fitted to the quiet two-call codes figures: 35 ms alone, 26.6 ms at 16 buyers, 21.4 ms at 64:
  the per-wakeup and per-commit costs are shared by more work at once, so throughput keeps rising
  well past 16 calls in flight), plus CONTENTION_US per call in flight (locks, memory);
- a refusal costs REFUSAL_MS of a core (the gateway's and the load generator's work for it);
- a new checkout's call is 40 % of that, its pay 60 %; a burst is 0.7 of its mean plus an
  exponential rest (seeded): a call never takes less than its fixed work.

Buyers as in `make bench-overload`: 16 closed-loop buyers measure capacity; then open-loop Poisson
arrivals at BENCH_LOADS x capacity for BENCH_LOAD_SECONDS; each buyer creates (new work, NORMAL),
then pays (CRITICAL), and gives up after BENCH_PATIENCE seconds; a refused buyer leaves at once.
The policies run in turns, level by level (`adaptive`: the gateway's defaults; `fixed20`: the same
with the limit fixed at 20, where the latency-target AIMD that came before sat in every quiet
run). Per level: goodput over capacity, p99 of successes, p99 of refusals, how each visit ended,
and the limit (median and range of its per-window values). What this cannot show is the real
platform's cost of serving refusals and its CPU per checkout under load (bench-overload,
bench-refusal).

BENCH_POLICIES ("adaptive,fixed20"), BENCH_CORES (2), BENCH_CPU_MS (18.1), BENCH_AMORTISED_MS
(254.7), BENCH_IO_MS (20), BENCH_CONTENTION_US (10), BENCH_REFUSAL_MS (0.4), BENCH_LOADS
("1,2,3,5"), BENCH_LOAD_SECONDS (20), BENCH_CAP_SECONDS (10), BENCH_PATIENCE (10): the model's
milliseconds and the levels' seconds are virtual.
"""
from __future__ import annotations

import asyncio
import os
import random
import sys

from _common import Result, percentile, report

from gateway.admission import OK, AdmissionControl
from gateway.policy import CRITICAL, NORMAL
from gateway.settings import GatewaySettings

POLICIES = os.environ.get("BENCH_POLICIES", "adaptive,fixed20").split(",")
CORES = int(os.environ.get("BENCH_CORES", "2"))
CPU_S = float(os.environ.get("BENCH_CPU_MS", "18.1")) / 1000
AMORTISED_S = float(os.environ.get("BENCH_AMORTISED_MS", "254.7")) / 1000
IO_S = float(os.environ.get("BENCH_IO_MS", "20")) / 1000
CONTENTION_S = float(os.environ.get("BENCH_CONTENTION_US", "10")) / 1e6
REFUSAL_S = float(os.environ.get("BENCH_REFUSAL_MS", "0.4")) / 1000
LOADS = [float(x) for x in os.environ.get("BENCH_LOADS", "1,2,3,5").split(",")]
LOAD_SECONDS = float(os.environ.get("BENCH_LOAD_SECONDS", "20"))
CAP_SECONDS = float(os.environ.get("BENCH_CAP_SECONDS", "10"))
PATIENCE = float(os.environ.get("BENCH_PATIENCE", "10"))
CAP_BUYERS = 16
REFUSED_PAUSE = 0.05  # a closed-loop buyer's pause after a refusal, as in bench-overload
BUDGET = 10.0  # a call's deadline, as a route's
SHARE = {"create": 0.4, "pay": 0.6}  # of a checkout's CPU and waits


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to its next timer whenever no callback is ready: sleeps and
    timeouts take no wall time, and the model's timing does not depend on the machine's load."""

    def __init__(self):
        super().__init__()
        self._virtual = 0.0

    def time(self) -> float:
        return self._virtual

    def _run_once(self) -> None:
        if not self._ready:
            pending = [h.when() for h in self._scheduled if not h.cancelled()]
            if pending and min(pending) > self._virtual:
                self._virtual = min(pending)
        super()._run_once()


def now() -> float:
    return asyncio.get_running_loop().time()


def control(policy: str) -> AdmissionControl:
    s = GatewaySettings(port=0, jwt_secret="x" * 32, backends={})
    fixed = policy == "fixed20"
    return AdmissionControl(min_limit=20 if fixed else s.concurrency_min, max_limit=20 if fixed else s.concurrency_max,
                            initial_limit=20 if fixed else s.concurrency_initial, tolerance=s.latency_tolerance,
                            target_seconds=s.latency_target_seconds, queue_seconds=s.queue_seconds,
                            queue_target_seconds=s.queue_target_seconds,
                            critical_queue_seconds=s.critical_queue_seconds, queue_max=s.queue_max, clock=now)


class Platform:
    """The gateway's admission in front of the model backend."""

    def __init__(self, policy: str):
        self.adm = control(policy)
        self.cores = asyncio.Semaphore(CORES)
        self.rng = random.Random(11)
        self.limits: list[int] = []
        self._refusals: set[asyncio.Task] = set()

    def checkout_cpu(self) -> float:
        c = self.adm.in_flight
        return CPU_S + AMORTISED_S / (c + 14) + CONTENTION_S * c

    def burst(self, mean: float) -> float:
        return mean * 0.7 + self.rng.expovariate(1 / (mean * 0.3))

    async def call(self, route: str, criticality: str) -> bool:
        """False: refused for load. The call runs to its end even when its buyer has left (the
        platform keeps working for them), as a call the gateway has sent does."""
        if not await self.adm.acquire(criticality, BUDGET):
            t = asyncio.create_task(self._use(REFUSAL_S))
            self._refusals.add(t)
            t.add_done_callback(self._refusals.discard)
            return False
        return await asyncio.shield(self._run(route))

    async def _use(self, seconds: float) -> None:
        async with self.cores:
            await asyncio.sleep(seconds)

    async def _run(self, route: str) -> bool:
        started = self.adm.clock()
        try:
            await self._use(self.burst(self.checkout_cpu() * SHARE[route]))
            await asyncio.sleep(self.burst(IO_S * SHARE[route]))
        finally:
            self.adm.release(route, started, OK)
            self.limits.append(self.adm.limit)
        return True


class Outcome:
    def __init__(self):
        self.ok: list[float] = []
        self.refusal_ms: list[float] = []
        self.ends: dict[str, int] = {}
        self.arrivals = 0

    def end(self, how: str) -> None:
        self.ends[how] = self.ends.get(how, 0) + 1


async def buy(p: Platform, out: Outcome) -> str:
    out.arrivals += 1
    t0 = now()
    stage = "create"

    async def flow() -> str:
        nonlocal stage
        for stage, criticality in (("create", NORMAL), ("pay", CRITICAL)):
            t = now()
            if not await p.call(stage, criticality):
                out.refusal_ms.append((now() - t) * 1000)
                return f"refused at {stage}"
        return "completed"

    try:
        how = await asyncio.wait_for(flow(), PATIENCE)
    except asyncio.TimeoutError:
        how = f"gave up at {stage}"
    out.end(how)
    if how == "completed":
        out.ok.append((now() - t0) * 1000)
    return how


async def capacity(p: Platform, seconds: float) -> tuple[float, Outcome]:
    out = Outcome()
    stop = now() + seconds

    async def worker():
        while now() < stop:
            if (await buy(p, out)).startswith("refused"):
                await asyncio.sleep(REFUSED_PAUSE)
    t0 = now()
    await asyncio.gather(*(worker() for _ in range(CAP_BUYERS)))
    return len(out.ok) / (now() - t0), out


async def open_loop(p: Platform, rate: float, seconds: float, seed: int) -> Outcome:
    out, tasks = Outcome(), set()
    rng = random.Random(seed)
    t0 = at = now()
    while True:
        at += rng.expovariate(rate)
        if at - t0 >= seconds:
            break
        if (delay := at - now()) > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(buy(p, out))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=PATIENCE + 5)
    while p.adm.in_flight:  # the level's last calls end before the next level starts
        await asyncio.sleep(0.05)
    return out


def row(policy: str, label: str, out: Outcome, seconds: float, cap: float, limits: list[int]) -> Result:
    ok, refused, limits = sorted(out.ok), sorted(out.refusal_ms), sorted(limits)
    goodput = len(ok) / seconds
    r = Result(f"{policy} {label}", CAP_BUYERS if label == "capacity" else 0, round(goodput, 1),
               round(percentile(ok, 0.5), 1), round(percentile(ok, 0.99), 1), round(ok[-1] if ok else 0.0, 1),
               limit_ops_per_s=round(cap, 1), ratio_to_limit=round(goodput / cap, 3) if cap else None)
    r.extra = {"arrivals": out.arrivals, "visits_ended": dict(sorted(out.ends.items())),
               "refusal_p99_ms": round(percentile(refused, 0.99), 1),
               "limit_p50": limits[len(limits) // 2] if limits else None,
               "limit_range": [limits[0], limits[-1]] if limits else None}
    r.notes = (f"refusal p99 {r.extra['refusal_p99_ms']} ms; limit p50 {r.extra['limit_p50']}; " +
               ", ".join(f"{k} {v}" for k, v in sorted(out.ends.items())))
    return r


async def main() -> None:
    print(f"model backend: {CORES} cores; a checkout {CPU_S * 1000:g} + {AMORTISED_S * 1000:g} / (c + 14) ms of CPU "
          f"+ {CONTENTION_S * 1e6:g} us x c (c calls in flight), {IO_S * 1000:g} ms of waits; a refusal "
          f"{REFUSAL_S * 1000:g} ms of CPU", flush=True)
    results: list[Result] = []
    policies = {name: Platform(name) for name in POLICIES}
    caps = {}
    for name, p in policies.items():
        await capacity(p, 2)  # warm up: the limit settles
        p.limits.clear()
        caps[name], out = await capacity(p, CAP_SECONDS)
        results.append(row(name, "capacity", out, CAP_SECONDS, caps[name], p.limits))
        print(f"{name}: capacity {caps[name]:.1f} checkouts/s, limit p50 {results[-1].extra['limit_p50']}", flush=True)
    cap = min(caps.values())  # one offered load for all, from the lowest capacity
    for i, x in enumerate(LOADS):
        for name, p in policies.items():
            p.limits.clear()
            out = await open_loop(p, cap * x, LOAD_SECONDS, seed=7 + i)
            results.append(row(name, f"{x:g}x offered", out, LOAD_SECONDS, cap, p.limits))
            r = results[-1]
            print(f"{name}: {x:g}x = {cap * x:.0f} arrivals/s: goodput {r.ratio_to_limit:.2f} of capacity, "
                  f"success p99 {r.p99_ms:.0f} ms, refusal p99 {r.extra['refusal_p99_ms']:.1f} ms, "
                  f"limit p50 {r.extra['limit_p50']}", flush=True)
    report("admission", results)


if __name__ == "__main__":
    asyncio.run(main(), loop_factory=VirtualTimeLoop) if sys.version_info >= (3, 12) else \
        VirtualTimeLoop().run_until_complete(main())
