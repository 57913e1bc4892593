"""Shared benchmark plumbing: latency stats, the results JSON (docs/conventions.md, "Benchmarks"), a
readable table, and a throwaway Postgres for benchmarks (CUTY_TEST_DSN or a local cluster).

Benchmarks are tools, not tests: they print figures and never fail for being slow.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Awaitable, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
for p in ("build/gen", "libs", "services/booking", "services/codepool", "services/payments",
          "services/gateway", "services/pspsim", "."):
    sys.path.insert(0, str(ROOT / p))
RESULTS = ROOT / "bench" / "results"


@dataclass
class Result:
    scenario: str
    concurrency: int
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    limit_ops_per_s: float | None = None
    ratio_to_limit: float | None = None
    notes: str = ""
    extra: dict = field(default_factory=dict)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[k]


@dataclass
class Run:
    ops: int
    seconds: float
    latencies_ms: list[float]
    errors: int = 0
    cpu_s: float = 0.0  # CPU seconds of the measured server process during the run (in_turns' pids)

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def result(self, scenario: str, concurrency: int, *, limit: "Run | None" = None, notes: str = "",
               **extra) -> Result:
        lat = sorted(self.latencies_ms)
        r = Result(scenario, concurrency, round(self.ops_per_s, 1), round(percentile(lat, 0.5), 2),
                   round(percentile(lat, 0.99), 2), round(lat[-1] if lat else 0.0, 2), notes=notes, extra=extra)
        if limit is not None:
            r.limit_ops_per_s = round(limit.ops_per_s, 1)
            r.ratio_to_limit = round(self.ops_per_s / limit.ops_per_s, 3) if limit.ops_per_s else None
        if self.errors:
            r.extra["errors"] = self.errors
        return r


async def closed_loop(op: Callable[[int], Awaitable[object]], *, concurrency: int, total: int | None = None,
                      duration: float | None = None) -> Run:
    """Run `op(i)` with `concurrency` workers until `total` ops or `duration` seconds; time each op."""
    latencies: list[float] = []
    errors = 0
    counter = 0
    stop_at = time.perf_counter() + duration if duration else None

    async def worker() -> None:
        nonlocal counter, errors
        while True:
            if total is not None and counter >= total:
                return
            if stop_at is not None and time.perf_counter() >= stop_at:
                return
            i = counter
            counter += 1
            t0 = time.perf_counter()
            try:
                await op(i)
            except Exception:  # noqa: BLE001 - counted, reported
                errors += 1
            latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Run(ops=len(latencies) - errors, seconds=time.perf_counter() - t0, latencies_ms=latencies, errors=errors)


def report(area: str, results: list[Result]) -> None:
    cols = ["scenario", "concurrency", "ops_per_s", "p50_ms", "p99_ms", "max_ms", "limit_ops_per_s", "ratio_to_limit", "notes"]
    rows = [[str(getattr(r, c) if getattr(r, c) is not None else "-") for c in cols] for r in results]
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    print(f"\n== bench {area} (cpu_count={os.cpu_count()}) ==")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    for r in results:
        if r.extra:
            print(f"  {r.scenario}: {json.dumps(r.extra)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"benchmark": area, "cpu_count": os.cpu_count(), "results": [asdict(r) for r in results]}
    (RESULTS / f"{area}.json").write_text(json.dumps(out, indent=2))
    print(f"wrote {RESULTS / (area + '.json')}")


def merged(runs: list[Run]) -> Run:
    """Runs of one variant taken in rounds (alternated with other variants), as one."""
    return Run(ops=sum(r.ops for r in runs), seconds=sum(r.seconds for r in runs),
               latencies_ms=[x for r in runs for x in r.latencies_ms], errors=sum(r.errors for r in runs))


def bench_postgres():
    """A Postgres for the benchmark: CUTY_TEST_DSN, or a throwaway local cluster.

    The throwaway cluster runs with fsync off (as the tests do): figures measure our code and the
    database's CPU work, not this machine's disk flushes."""
    from cutylib.testing.postgres import start_test_postgres

    return start_test_postgres()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` so far (all its threads), from /proc; 0 once it exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # a backend that exited
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def in_turns(variants: dict[str, Callable[[int], tuple[Callable[[int], Awaitable[object]], int | None]]], *,
                   rounds: int, concurrency: int, pids: dict[str, int] | None = None,
                   duration: float | None = None,
                   db_pids: list[int] | None = None) -> tuple[dict[str, list[Run]], dict[str, float]]:
    """The variants take turns in `rounds` short rounds, so that load from anything else on the
    machine falls on all of them alike: in round r, each variant's `variants[name](r)` gives the
    op and how many to run (one closed loop of `concurrency`), or with `duration`, the op alone
    (None for the count) run for that many seconds. Returns each variant's runs (each with the CPU
    seconds its server process, `pids[name]` where given, spent in it) and those CPU seconds summed;
    with `db_pids` (database backends), also the CPU seconds those spent, as
    `cpu[name + " (database)"]`."""
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    cpu = {name: 0.0 for name in variants} | {f"{name} (database)": 0.0 for name in variants if db_pids}
    pids = pids or {}
    for r in range(rounds):
        for name, round_of in variants.items():
            op, total = round_of(r)
            pid = pids.get(name)
            cpu0 = cpu_seconds(pid) if pid else 0.0
            db0 = sum(cpu_seconds(p) for p in db_pids or ())
            run = await closed_loop(op, concurrency=concurrency, total=total, duration=duration)
            if pid:
                run.cpu_s = cpu_seconds(pid) - cpu0
                cpu[name] += run.cpu_s
            if db_pids:
                cpu[f"{name} (database)"] += sum(cpu_seconds(p) for p in db_pids) - db0
            runs[name].append(run)
    return runs, cpu


def postgres_cpu(server) -> dict[int, float]:
    """CPU seconds of each backend of the benchmark's own cluster (children of its postmaster)."""
    cluster = getattr(server, "cluster", None)
    if cluster is None:
        return {}
    with open(os.path.join(cluster.datadir, "postmaster.pid")) as f:
        postmaster = f.readline().strip()
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == postmaster:
                    out[int(pid)] = cpu_seconds(int(pid))
        except OSError:
            continue
    return out


def all_cpu(stack, server, client: str = "client") -> dict[str, float]:
    """CPU seconds so far: each service process of `stack`, Postgres' backends, and this process
    (the load generator) as `client`."""
    cpu = {n: cpu_seconds(p.proc.pid) for n, p in stack.procs.items()}
    cpu["postgres"] = sum(postgres_cpu(server).values())
    t = os.times()
    cpu[client] = t.user + t.system
    return cpu


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, every core (/proc/stat): what other
    work on a shared machine took is the busy time that none of the benchmark's processes used."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return (total - idle) / tick, total / tick


class Http:
    """One keep-alive HTTP/1.1 connection; just enough protocol for the gateway's answers."""

    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None
        self.retry_after: float | None = None  # the last answer's Retry-After, seconds

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None or self.reader.at_eof():  # (re)connect, as any keep-alive client does
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = [f"{method} {path} HTTP/1.1", "Host: bench", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError(f"{method} {path}: the server closed the connection without answering")
        length, close, self.retry_after = 0, False, None
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
            elif name == b"retry-after":
                self.retry_after = float(value)
        answer = int(status_line.split()[1]), await self.reader.readexactly(length)
        if close:  # the server closes after this answer (e.g. one given before the body was read)
            self.close()
        return answer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def contract_check_cost(scenario: str, message, per_request_cpu_ms: float, *, rounds: int = 20,
                        per_round: int = 2000) -> Result:
    """What checking `message` against its contract (cutylib.validation, the protovalidate engine
    every server and the gateway run on each request) costs, measured on this very message in this
    process: checks per second, the time per check (p50/p99 over rounds), and its share of
    `per_request_cpu_ms` (a server's CPU per request measured in the same run)."""
    from cutylib import validation
    assert validation.violations(message) == [], "the benchmark's request must keep its contract"
    per_check_us = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            validation.violations(message)
        per_check_us.append(1e6 * (time.perf_counter() - t0) / per_round)
    per_check_us.sort()
    mean_us = sum(per_check_us) / len(per_check_us)
    share = 100 * (mean_us / 1000) / per_request_cpu_ms if per_request_cpu_ms else None
    return Result(scenario, 1, round(1e6 / mean_us, 1), round(percentile(per_check_us, 0.5) / 1000, 4),
                  round(percentile(per_check_us, 0.99) / 1000, 4), round(per_check_us[-1] / 1000, 4),
                  notes=f"{mean_us:.2f} us per check = {share:.2f} % of {per_request_cpu_ms:.3f} ms server CPU per request"
                  if share is not None else f"{mean_us:.2f} us per check",
                  extra={"us_per_check": round(mean_us, 3), "share_of_request_cpu_pct": round(share, 3) if share else None})
