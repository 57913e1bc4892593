"""Salon benchmark (`make bench-salon`): services and working hours (docs/booking.md).

  (a) GetAvailability of a salon with 20 stylists for 7 days (one service, every stylist able,
      a quarter of the week booked), one call at a time: the client's view, and the time inside
      the booking process (its rpc_server_call_duration_seconds histogram, scraped before and
      after: the share of calls within 20 ms, which is the target p99 <= 20 ms when >= 0.99);
      beside it the statement alone through raw asyncpg (booking_service_times, the same rows).
  (b) HoldSlot of a service time with any free stylist against HoldSlot of the same service on a
      named stylist, 64 in flight, alternated in rounds; ratio any / named (target >= 0.8), the
      CPU per hold of the booking process and of its database connections, and how many of those
      connections wait on a lock (pg_stat_activity sampled every 10 ms): waiting, not work, is
      what a racer queued behind another's uncommitted insert costs.

The booking server runs as a subprocess, as deployed (bench/booking.py's Server). Figures on a
shared 2-core machine are noisy; BENCH_SCALE=0.2 is a quick run.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import sys
import re
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone

from _common import Result, bench_postgres, closed_loop, in_turns, merged, report

from cutylib.testing.procs import REPO, free_port  # noqa: E402  (after _common put the paths in place)
from cutylib import heap  # noqa: E402
from cuty.booking.v1 import booking_pb2 as pb
from cuty.common.v1 import common_pb2
from cutylib.config import with_database
from cutylib.db import create_pool

def _booking_bench():
    """bench/booking.py (its Server and ts), loaded by path: `booking` is the service's package."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_booking", REPO / "bench" / "booking.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_bb = _booking_bench()
Server, ts = _bb.Server, _bb.ts

SCALE = float(os.environ.get("BENCH_SCALE", "1"))
STYLISTS = 20
DAYS = 7
QUERIES = int(400 * SCALE)
HOLDS = int(4000 * SCALE)  # per variant of (b)
ROUNDS = 4
IN_FLIGHT = 64
ZONE = "Europe/Berlin"
AVAILABILITY_SQL = ("SELECT start_time, resource_ids FROM booking_service_times($1, $2, NULL, "
                    "($3::date)::timestamp AT TIME ZONE 'Europe/Berlin', "
                    "($4::date + 1)::timestamp AT TIME ZONE 'Europe/Berlin')")


async def salon(clients, stylists: int) -> tuple[str, list[str], pb.Service]:
    stub, admin = clients.catalog, clients.admin
    s = await stub.CreateSalon(pb.CreateSalonRequest(name="bench salon", time_zone=ZONE), metadata=admin)
    await stub.SetBookingSettings(pb.SetBookingSettingsRequest(salon_id=s.id, min_notice_minutes=0,
                                                               booking_horizon_days=120, time_step_minutes=15),
                                  metadata=admin)
    rs = []
    for i in range(stylists):
        r = await stub.CreateResource(pb.CreateResourceRequest(salon_id=s.id, name=f"stylist {i}"), metadata=admin)
        await stub.SetWorkingHours(pb.SetWorkingHoursRequest(salon_id=s.id, resource_id=r.id, intervals=[
            pb.WeeklyInterval(weekday=d, opens="09:00", closes="19:00") for d in range(1, 8)]), metadata=admin)
        rs.append(r.id)
    service = await stub.CreateService(pb.CreateServiceRequest(
        salon_id=s.id, name="Cut", duration_minutes=45, buffer_after_minutes=15, resource_ids=rs,
        price=common_pb2.Money(currency_code="EUR", amount_minor=4500)), metadata=admin)
    return s.id, rs, service


def local_starts(first_day, days: int, hours=range(9, 19)) -> list[datetime]:
    from zoneinfo import ZoneInfo
    zone = ZoneInfo(ZONE)
    return [datetime(d.year, d.month, d.day, h, tzinfo=zone).astimezone(timezone.utc)
            for d in (first_day + timedelta(days=k) for k in range(days)) for h in hours]


async def service_slots(clients, service_id: str, pairs: list[tuple[str, datetime]]) -> list[str]:
    stub, md = clients.holds[0], clients.md
    out = []
    for resource, start in pairs:
        out.append((await stub.GetServiceSlot(pb.GetServiceSlotRequest(
            service_id=service_id, start_time=ts(start), resource_id=resource), metadata=md)).id)
    return out


def holder(clients, slot_ids: list[str], tag: str):
    stubs, md = clients.holds, clients.md

    async def op(i: int) -> None:
        await stubs[i % len(stubs)].HoldSlot(pb.HoldSlotRequest(
            slot_id=slot_ids[i], customer_id=f"{tag}-{i}", request_id=f"{tag}-{i}"), timeout=30, metadata=md)
    return op


def rpc_buckets(port: int, method: str) -> dict[float, float]:
    """The booking process's duration histogram of `method` (cumulative count per upper bound)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[float, float] = {}
    for m in re.finditer(r'^rpc_server_call_duration_seconds_bucket\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("rpc_method") == method and labels.get("rpc_response_status_code") == "OK":
            le = float(labels["le"])
            out[le] = out.get(le, 0.0) + float(m.group(2))
    return out


def at_server(before: dict[float, float], after: dict[float, float]) -> dict:
    """Calls between two scrapes: their count, the share within 20 ms, and the bucket their p99 is in."""
    diff = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = diff.get(float("inf"), 0.0)
    if not total:
        return {}
    p99 = next(le for le in sorted(diff) if diff[le] >= 0.99 * total)
    return {"server_calls": int(total), "server_share_within_20ms": round(diff.get(0.02, 0.0) / total, 4),
            "server_p99_at_most_ms": p99 * 1000, "server_target_met": diff.get(0.02, 0.0) >= 0.99 * total}


async def availability(clients, server, pool, results: list[Result]) -> None:
    salon_id, rs, service = await salon(clients, STYLISTS)
    first = (datetime.now(timezone.utc) + timedelta(days=2)).date()
    # a quarter of the week booked: every stylist at 09, 12 (and 15 for half of them) each day
    pairs = [(r, t) for i, r in enumerate(rs) for t in local_starts(first, DAYS, (9, 12) + ((15,) if i % 2 else ()))]
    booked = await service_slots(clients, service.id, pairs)
    await closed_loop(holder(clients, booked, "booked"), concurrency=16, total=len(booked))
    req = pb.GetAvailabilityRequest(salon_id=salon_id, service_id=service.id, start_day=first.isoformat(),
                                    end_day=(first + timedelta(days=DAYS - 1)).isoformat(), page_size=2000)
    page = await clients.catalog.GetAvailability(req, metadata=clients.admin)
    times = len(page.times)

    async def grpc_op(i: int) -> None:
        await clients.catalog.GetAvailability(req, metadata=clients.admin, timeout=30)

    merchant = await pool.fetchval("SELECT merchant_id FROM services WHERE id = $1", uuid.UUID(service.id))

    async def sql_op(i: int) -> None:
        await pool.fetch(AVAILABILITY_SQL, merchant, uuid.UUID(service.id), first, first + timedelta(days=DAYS - 1))

    for op in (grpc_op, sql_op):
        await closed_loop(op, concurrency=1, total=20)  # warm: plans cached, connections open
    heap.settle()  # the client's own collector pauses out of its timings, as in the services
    runs = {"grpc": [], "sql": []}
    totals = {le: 0.0 for le in rpc_buckets(server.metrics_port, "GetAvailability")}
    for _ in range(ROUNDS):
        before = rpc_buckets(server.metrics_port, "GetAvailability")
        runs["grpc"].append(await closed_loop(grpc_op, concurrency=1, total=QUERIES // ROUNDS))
        after = rpc_buckets(server.metrics_port, "GetAvailability")
        totals = {le: totals.get(le, 0.0) + after.get(le, 0.0) - before.get(le, 0.0) for le in after}
        runs["sql"].append(await closed_loop(sql_op, concurrency=1, total=QUERIES // ROUNDS))
    sql = merged(runs["sql"])
    results.append(merged(runs["grpc"]).result(
        f"a: GetAvailability, {STYLISTS} stylists x {DAYS} days, over gRPC", 1, limit=sql,
        notes="target p99 <= 20 ms at the server (see server_*)", times_answered=times,
        holds_in_week=len(booked), **at_server({}, totals)))
    results.append(sql.result("a: booking_service_times() via raw asyncpg", 1, notes="the statement alone"))


async def lock_waits(pool, state: dict, stop: asyncio.Event) -> None:
    """Every 10 ms: how many database connections wait on a heavyweight lock (a row, a
    transaction: an INSERT queued behind another's uncommitted hold) and how many are active, for
    the variant running now (state["variant"])."""
    sql = ("SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) FILTER (WHERE state = 'active') "
           "FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' "
           "AND pid <> pg_backend_pid()")
    async with pool.acquire() as conn:
        while not stop.is_set():
            name = state.get("variant")
            waiting, active = await conn.fetchrow(sql)
            if name:
                w = state.setdefault("waits", {}).setdefault(name, [0, 0, 0])
                w[0] += waiting
                w[1] += active
                w[2] += 1
            await asyncio.sleep(0.01)


async def any_vs_named(clients, server, pool, results: list[Result]) -> None:
    """Three variants, alternated in rounds: a named stylist per hold (no two calls want one time);
    any free stylist with the calls in flight spread over many times (round robin over them); and
    any free stylist with the calls in flight bunched on a few times (each time's 20 holds queued
    together, so up to 64 calls race for the same 2-3 times: the contended case)."""
    _, rs, service = await salon(clients, STYLISTS)
    first = (datetime.now(timezone.utc) + timedelta(days=3)).date()
    per_day = 10 * STYLISTS  # one hold per stylist and hour: the blocks (45 + 15 minutes) touch
    days = -(-3 * HOLDS // per_day) + 3
    starts = local_starts(first, days)
    third = len(starts) // 3
    named_ids = (await service_slots(clients, service.id, [(r, t) for t in starts[:third] for r in rs]))[:HOLDS]
    spread_times = await service_slots(clients, service.id, [("", t) for t in starts[third:2 * third]])
    bunched_times = await service_slots(clients, service.id, [("", t) for t in starts[2 * third:]])
    chunk = HOLDS // ROUNDS
    variants = {"named": named_ids, "any, spread": [], "any, bunched": []}
    for r in range(ROUNDS):  # each round's part takes whole times: 20 holds of each
        times = spread_times[r * chunk // STYLISTS:(r + 1) * chunk // STYLISTS]
        variants["any, spread"] += [t for _ in rs for t in times]
        times = bunched_times[r * chunk // STYLISTS:(r + 1) * chunk // STYLISTS]
        variants["any, bunched"] += [t for t in times for _ in rs]

    state: dict = {}

    def turns(name: str, ids: list[str]):
        def round_of(r: int):
            part = ids[r * chunk:(r + 1) * chunk]
            hold = holder(clients, part, f"{name.replace(', ', '-')}{r}")

            async def op(i: int) -> None:
                state["variant"] = name
                await hold(i)
            return op, len(part)
        return round_of
    # the booking process's pool connections (opened at its start): their backends' CPU is the
    # database's work for the holds
    backends = [r[0] for r in await pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' "
        "AND pid <> pg_backend_pid() AND application_name NOT LIKE 'bench%'")]
    stop = asyncio.Event()
    sampler = asyncio.create_task(lock_waits(pool, state, stop))
    try:
        runs, cpu = await in_turns({name: turns(name, ids) for name, ids in variants.items()}, rounds=ROUNDS,
                                   concurrency=IN_FLIGHT, pids={name: server.proc.proc.pid for name in variants},
                                   db_pids=backends)
    finally:
        stop.set()
        await sampler
    named = merged(runs["named"])
    for name in ("any, spread", "any, bunched", "named"):
        run = merged(runs[name])
        waiting, active, samples = state.get("waits", {}).get(name, [0, 0, 1])
        results.append(run.result(
            f"b: HoldSlot, service time, {name}", IN_FLIGHT, limit=None if name == "named" else named,
            notes="target ratio >= 0.8 of the named" if name == "any, spread" else "",
            server_cpu_ms_per_op=round(1000 * cpu[name] / max(1, run.ops), 3),
            db_cpu_ms_per_op=round(1000 * cpu[f"{name} (database)"] / max(1, run.ops), 3),
            db_connections_waiting_on_locks=round(waiting / max(1, samples), 2),
            db_connections_active=round(active / max(1, samples), 2)))


async def main() -> None:
    pg = bench_postgres()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="cuty-bench-salon-"))
    dsn = with_database(pg.dsn, "cuty_booking")
    results: list[Result] = []
    try:
        t0 = time.perf_counter()
        metrics_port = free_port()
        server = Server(dsn, workdir, "salon", CUTY_BOOKING_METRICS_PORT=str(metrics_port))
        server.metrics_port = metrics_port
        async with server as clients:
            pool = await create_pool(dsn, min_size=2, max_size=3, server_settings={"application_name": "bench"})
            try:
                await availability(clients, server, pool, results)
                await any_vs_named(clients, server, pool, results)
            finally:
                await pool.close()
        print(f"bench took {time.perf_counter() - t0:.1f} s; server logs in {workdir}")
        report("salon", results)
    finally:
        pg.close()


if __name__ == "__main__":
    asyncio.run(main())
