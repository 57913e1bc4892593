"""The gateway's admission policy alone (`make bench-admission`): goodput past capacity in front of a
model backend of fixed capacity, with the short wait for a freed place and without it.

`make bench-overload` measures the whole platform, but on a machine shared with other work its
wall-clock goodput moves by more between runs of the same code than between policies. This
isolates the policy: the gateway's real `AdmissionControl` (its settings' defaults; the AIMD limit
included) admits each call, and the backend is a model with CORES workers served first come first
served, a new checkout's call costing on average CREATE_MS and its pay PAY_MS of a worker
(exponentially distributed, seeded: real calls' times vary, and bursts of slow ones are what fills
the limit at an offered load equal to capacity; asyncio sleeps:
in virtual time: the event loop jumps to its next timer whenever nothing is ready, so other work on
the machine does not move the figures and a run is repeatable). Its capacity is CORES /
(CREATE_MS + PAY_MS) checkouts a second.

Buyers as in `make bench-overload`: 16 closed-loop buyers measure capacity; then open-loop Poisson
arrivals at BENCH_LOADS x capacity for BENCH_LOAD_SECONDS; each buyer creates (new work, NORMAL),
then pays (CRITICAL), and gives up after BENCH_PATIENCE seconds; a refused buyer leaves at once.
The two policies run in turns, level by level (`queue`: the defaults; `instant`: no wait, every
request finding its share in use refused at once). Per level: goodput over capacity, p99 of
successes, p99 of refusals, and how each visit ended (completed, refused at create / at pay, gave
up). The same defaults decide in the gateway; what this cannot show is the platform's own cost of
serving refusals and its CPU per checkout under load (bench-overload, bench-refusal).

BENCH_CORES (2), BENCH_CREATE_MS (10), BENCH_PAY_MS (15), BENCH_LOADS ("1,2,3,5"),
BENCH_LOAD_SECONDS (20), BENCH_CAP_SECONDS (10), BENCH_PATIENCE (10): the model's milliseconds and
the levels' seconds are virtual.
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

CORES = int(os.environ.get("BENCH_CORES", "2"))
CREATE_S = float(os.environ.get("BENCH_CREATE_MS", "10")) / 1000
PAY_S = float(os.environ.get("BENCH_PAY_MS", "15")) / 1000
LOADS = [float(x) for x in os.environ.get("BENCH_LOADS", "1,2,3,5").split(",")]
LOAD_SECONDS = float(os.environ.get("BENCH_LOAD_SECONDS", "20"))
CAP_SECONDS = float(os.environ.get("BENCH_CAP_SECONDS", "10"))
PATIENCE = float(os.environ.get("BENCH_PATIENCE", "10"))
CAP_BUYERS = 16
REFUSED_PAUSE = 0.05  # a closed-loop buyer's pause after a refusal, as in bench-overload
BUDGET = 10.0  # a call's deadline, as a route's


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
    queue = policy == "queue"
    return AdmissionControl(min_limit=s.concurrency_min, max_limit=s.concurrency_max,
                            initial_limit=s.concurrency_initial, tolerance=s.latency_tolerance,
                            target_seconds=s.latency_target_seconds,
                            queue_seconds=s.queue_seconds if queue else 0.0,
                            queue_target_seconds=s.queue_target_seconds if queue else 0.0,
                            critical_queue_seconds=s.critical_queue_seconds if queue else 0.0,
                            queue_max=s.queue_max if queue else 0, clock=now)


class Platform:
    """The gateway's admission in front of the model backend."""

    def __init__(self, policy: str):
        self.adm = control(policy)
        self.workers = asyncio.Semaphore(CORES)
        self.rng = random.Random(11)

    async def call(self, route: str, criticality: str, work: float) -> bool:
        """False: refused for load. The call runs to its end even when its buyer has left (the
        platform keeps working for them), as a call the gateway has sent does."""
        t = now()
        if not await self.adm.acquire(criticality, BUDGET):
            return False
        return await asyncio.shield(self._run(route, work, t))

    async def _run(self, route: str, work: float, t: float) -> bool:
        started = self.adm.clock()
        try:
            async with self.workers:
                await asyncio.sleep(self.rng.expovariate(1 / work))
        finally:
            self.adm.release(route, started, OK)
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
        for stage, route, criticality, work in (("create", "create", NORMAL, CREATE_S), ("pay", "pay", CRITICAL, PAY_S)):
            t = now()
            if not await p.call(route, criticality, work):
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


def row(policy: str, label: str, out: Outcome, seconds: float, cap: float) -> Result:
    ok, refused = sorted(out.ok), sorted(out.refusal_ms)
    goodput = len(ok) / seconds
    r = Result(f"{policy} {label}", CAP_BUYERS if label == "capacity" else 0, round(goodput, 1),
               round(percentile(ok, 0.5), 1), round(percentile(ok, 0.99), 1), round(ok[-1] if ok else 0.0, 1),
               limit_ops_per_s=round(cap, 1), ratio_to_limit=round(goodput / cap, 3) if cap else None)
    r.extra = {"arrivals": out.arrivals, "visits_ended": dict(sorted(out.ends.items())),
               "refusal_p99_ms": round(percentile(refused, 0.99), 1)}
    r.notes = (f"refusal p99 {r.extra['refusal_p99_ms']} ms; " +
               ", ".join(f"{k} {v}" for k, v in sorted(out.ends.items())))
    return r


async def main() -> None:
    model = CORES / (CREATE_S + PAY_S)
    print(f"model backend: {CORES} workers, {CREATE_S * 1000:g} + {PAY_S * 1000:g} ms per checkout "
          f"= {model:.1f} checkouts/s", flush=True)
    results: list[Result] = []
    policies = {"queue": Platform("queue"), "instant": Platform("instant")}
    caps = {}
    for name, p in policies.items():
        await capacity(p, 2)  # warm up: the limit settles
        caps[name], out = await capacity(p, CAP_SECONDS)
        results.append(row(name, "capacity", out, CAP_SECONDS, caps[name]))
        print(f"{name}: capacity {caps[name]:.1f} checkouts/s", flush=True)
    cap = min(caps.values())  # one offered load for both, from the lower capacity
    for i, x in enumerate(LOADS):
        for name, p in policies.items():
            print(f"{name}: {x:g}x = {cap * x:.0f} arrivals/s for {LOAD_SECONDS:g} s ...", flush=True)
            out = await open_loop(p, cap * x, LOAD_SECONDS, seed=7 + i)
            results.append(row(name, f"{x:g}x offered", out, LOAD_SECONDS, cap))
    report("admission", results)


if __name__ == "__main__":
    asyncio.run(main(), loop_factory=VirtualTimeLoop) if sys.version_info >= (3, 12) else \
        VirtualTimeLoop().run_until_complete(main())
