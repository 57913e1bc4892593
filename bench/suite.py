"""How long the test suite takes, serially and on parallel workers (`make bench-suite`).

    make bench-suite                                   # the whole suite as `make test` runs it
    SUITE_SIDES=serial,parallel SUITE_PATHS=tests/integration/booking make bench-suite

Each side runs pytest as `make test` does (`-n SUITE_WORKERS --dist loadgroup`; serial: `-n 0`),
one after the other, and prints its wall time, the CPU seconds of pytest and every process it
started (services, promtool; not the PostgreSQL servers, which detach), the machine's busy CPU
seconds meanwhile (other work on a shared machine shows as busy time beyond the suite's), the test
counts, the slowest tests, and the ratio parallel / serial. For the whole suite it prints PASS or
FAIL against the budget: `make test` under 8 minutes of wall time on 2 cores.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from _common import RESULTS, ROOT, machine_cpu

BUDGET_SECONDS = 8 * 60


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_side(side: str, paths: list[str], workers: int) -> dict:
    n = "0" if side == "serial" else str(workers)
    base = tempfile.mkdtemp(prefix=f"cuty-bench-suite-{side}-")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", n, "--dist", "loadgroup",
           "--durations=15", f"--basetemp={base}", *paths]
    print(f"\n-- {side}: {' '.join(cmd[1:])}", flush=True)
    busy0, total0 = machine_cpu()
    cpu0, t0 = children_cpu(), time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    cpu = children_cpu() - cpu0
    busy1, total1 = machine_cpu()
    shutil.rmtree(base, ignore_errors=True)
    out = proc.stdout + proc.stderr
    summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed|error)", line)), "")
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}
    slowest = re.findall(r"^\s*([\d.]+)s (call|setup|teardown)\s+(\S+)", out, re.M)[:15]
    if proc.returncode != 0:
        print(out[-4000:])
    return {"side": side, "workers": int(n), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "machine_busy_s": round(busy1 - busy0, 1), "machine_total_s": round(total1 - total0, 1),
            "rc": proc.returncode, "counts": counts, "summary": summary.strip("= "),
            "slowest": [{"seconds": float(s), "phase": p, "test": t} for s, p, t in slowest]}


def main() -> None:
    paths = os.environ.get("SUITE_PATHS", "tests").split()
    sides = [s.strip() for s in os.environ.get("SUITE_SIDES", "parallel").split(",") if s.strip()]
    workers = int(os.environ.get("SUITE_WORKERS", "4"))
    if not set(sides) <= {"serial", "parallel"}:
        raise SystemExit("SUITE_SIDES: serial and/or parallel")
    results = [run_side(side, paths, workers) for side in sides]

    print(f"\n== bench suite (cpu_count={os.cpu_count()}, paths={' '.join(paths)}) ==")
    print(f"{'side':<9} {'workers':>7} {'wall_s':>8} {'cpu_s':>8} {'cpu/wall':>8} {'machine_busy_s':>14}  result")
    for r in results:
        print(f"{r['side']:<9} {r['workers']:>7} {r['wall_s']:>8} {r['cpu_s']:>8} "
              f"{r['cpu_s'] / r['wall_s'] if r['wall_s'] else 0:>8.2f} {r['machine_busy_s']:>14}  {r['summary']}")
    by = {r["side"]: r for r in results}
    if {"serial", "parallel"} <= set(by):
        print(f"parallel / serial wall time: {by['parallel']['wall_s'] / by['serial']['wall_s']:.2f}")
    for r in results:
        print(f"\nslowest ({r['side']}):")
        for s in r["slowest"]:
            print(f"  {s['seconds']:>7.2f}s {s['phase']:<8} {s['test']}")
    if paths == ["tests"]:
        for r in results:
            ok = r["rc"] == 0 and r["wall_s"] < BUDGET_SECONDS
            print(f"{'PASS' if ok else 'FAIL'}: make test ({r['side']}, {r['workers']} workers) "
                  f"{r['wall_s']:.0f} s, budget {BUDGET_SECONDS} s, rc {r['rc']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "suite.json").write_text(json.dumps({"benchmark": "suite", "cpu_count": os.cpu_count(),
                                                    "paths": paths, "results": results}, indent=2))
    print(f"wrote {RESULTS / 'suite.json'}")


if __name__ == "__main__":
    main()
