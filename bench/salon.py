"""Salon benchmark (`make bench-salon`): services and working hours (docs/booking.md).

  (a) GetAvailability of a salon with 20 stylists for 7 days (one service, every stylist able,
      a quarter of the week booked), one call at a time: the server's answer time; beside it the
      statement alone through raw asyncpg (booking_service_times, the same rows).
  (b) HoldSlot of a service time with any free stylist against HoldSlot of the same service on a
      named stylist, 64 in flight, alternated in rounds; ratio any / named (target >= 0.8).

The booking server runs as a subprocess, as deployed (bench/booking.py's Server). Figures on a
shared 2-core machine are noisy; BENCH_SCALE=0.2 is a quick run.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone

from _common import Result, bench_postgres, closed_loop, in_turns, merged, report

from cutylib.testing.procs import REPO  # noqa: E402  (after _common put the paths in place)
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


async def availability(clients, pool, results: list[Result]) -> None:
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
    runs = {"grpc": [], "sql": []}
    for _ in range(ROUNDS):
        runs["grpc"].append(await closed_loop(grpc_op, concurrency=1, total=QUERIES // ROUNDS))
        runs["sql"].append(await closed_loop(sql_op, concurrency=1, total=QUERIES // ROUNDS))
    sql = merged(runs["sql"])
    results.append(merged(runs["grpc"]).result(
        f"a: GetAvailability, {STYLISTS} stylists x {DAYS} days, over gRPC", 1, limit=sql,
        notes="target p99 <= 20 ms at the server", times_answered=times, holds_in_week=len(booked)))
    results.append(sql.result("a: booking_service_times() via raw asyncpg", 1, notes="the statement alone"))


async def any_vs_named(clients, server, results: list[Result]) -> None:
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

    def turns(name: str, ids: list[str]):
        def round_of(r: int):
            part = ids[r * chunk:(r + 1) * chunk]
            return holder(clients, part, f"{name.replace(', ', '-')}{r}"), len(part)
        return round_of
    runs, cpu = await in_turns({name: turns(name, ids) for name, ids in variants.items()}, rounds=ROUNDS,
                               concurrency=IN_FLIGHT, pids={name: server.proc.proc.pid for name in variants})
    named = merged(runs["named"])
    for name in ("any, spread", "any, bunched", "named"):
        run = merged(runs[name])
        results.append(run.result(
            f"b: HoldSlot, service time, {name}", IN_FLIGHT, limit=None if name == "named" else named,
            notes="target ratio >= 0.8 of the named" if name == "any, spread" else "",
            server_cpu_ms_per_op=round(1000 * cpu[name] / max(1, run.ops), 3)))


async def main() -> None:
    pg = bench_postgres()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="cuty-bench-salon-"))
    dsn = with_database(pg.dsn, "cuty_booking")
    results: list[Result] = []
    try:
        t0 = time.perf_counter()
        server = Server(dsn, workdir, "salon")
        async with server as clients:
            pool = await create_pool(dsn, min_size=2, max_size=2)
            try:
                await availability(clients, pool, results)
                await any_vs_named(clients, server, results)
            finally:
                await pool.close()
        print(f"bench took {time.perf_counter() - t0:.1f} s; server logs in {workdir}")
        report("salon", results)
    finally:
        pg.close()


if __name__ == "__main__":
    asyncio.run(main())
