"""Booking benchmark (`make bench-booking`): how fast HoldSlot decides, and how it loses gracefully.

  (a) uncontended HoldSlot over gRPC, 64 in flight, against the same INSERT through raw asyncpg
  (b) one hot slot, 1,000 concurrent HoldSlot: one winner, 999 losers with alternatives, time to answer all
  (c) the pessimistic alternative (SELECT ... FOR UPDATE, check, INSERT) on a hot slot, beside (b)

The server runs as a subprocess (`python -m booking`: its own event loop and GIL, as deployed, with
OpenTelemetry instrumentation on); (a) is repeated with OTEL_SDK_DISABLED=true to show what the
instrumentation costs. Figures on a shared 2-core machine are noisy; BENCH_SCALE=0.2 is a quick run.
Beside each gRPC variant of (a), the booking process's own CPU per HoldSlot (from /proc,
`server_cpu_ms_per_op`): steadier than throughput when other work shares the cores.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone

from _common import Result, bench_postgres, closed_loop, contract_check_cost, in_turns, merged, report  # puts services and generated code on sys.path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from cutylib.db import create_pool
from cuty.booking.v1 import booking_pb2 as pb
from cuty.booking.v1 import booking_pb2_grpc
from cuty.common.v1 import common_pb2
from cutylib.config import Settings, with_database
from cutylib.grpc_errors import unpack_detail
from cutylib.testing.trust import TEST_MERCHANT, dev_pki, user
from cutylib.tls import Transport
from cutylib.testing.procs import ServiceProcess, base_env, free_port

SCALE = float(os.environ.get("BENCH_SCALE", "1"))
N = int(15000 * SCALE)   # holds per measured run of (a)
WARMUP = 1000
IN_FLIGHT = 64
HOT = 1000
POOL = int(os.environ.get("BENCH_SERVER_POOL", "16"))  # server pool, and the raw client's
CHANNELS = 2

RAW_INSERT = """
INSERT INTO holds (id, slot_id, salon_id, resource_id, customer_id, request_id, start_time, end_time,
                   price_minor, currency, merchant_id, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, clock_timestamp() + interval '300 seconds')
ON CONFLICT DO NOTHING
RETURNING id
"""
TAKE_HOLD = "SELECT outcome, hold, alternatives, time_zone, db_now FROM booking_take_hold($1, $2, $3, $4, 300, 3, 3)"
# The pessimistic way: lock the slot row, look for an overlapping active hold, insert. The lock is
# held across the round trips, so every racer queues behind the one in front.
LOCK_SLOT = ("SELECT id, salon_id, resource_id, start_time, end_time, price_minor, currency, merchant_id "
             "FROM slots WHERE id = $1 FOR UPDATE")
BUSY = """
SELECT EXISTS (SELECT 1 FROM holds h
                WHERE h.merchant_id = $4 AND h.resource_id = $1 AND h.status IN ('held', 'confirmed') AND h.during && tstzrange($2, $3)
                  AND (h.status = 'confirmed' OR h.expires_at > clock_timestamp()))"""
# Losers of (c) get alternatives too, so both sides give the same answer (same length, same chair
# first, nearest; without the same-day tier).
ALTERNATIVES = """
SELECT s.id FROM slots s
 WHERE s.merchant_id = $6 AND s.salon_id = $1 AND s.id <> $2 AND s.start_time > clock_timestamp()
   AND s.end_time - s.start_time = $4::timestamptz - $3::timestamptz
   AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.merchant_id = s.merchant_id AND h.resource_id = s.resource_id AND h.status IN ('held', 'confirmed')
                      AND h.during && tstzrange(s.start_time, s.end_time)
                      AND (h.status = 'confirmed' OR h.expires_at > clock_timestamp()))
 ORDER BY s.resource_id <> $5::uuid, abs(extract(epoch FROM s.start_time - $3::timestamptz)), s.start_time
 LIMIT 3"""


def ts(dt: datetime) -> Timestamp:
    t = Timestamp()
    t.FromDatetime(dt)
    return t


def days_ahead(days: int) -> datetime:
    return datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + timedelta(days=days)


async def seed(clients: "Clients", n_resources: int, per_resource: int, start: datetime, minutes: int = 30) -> list[pb.Slot]:
    stub, admin = clients.catalog, clients.admin
    salon = await stub.CreateSalon(pb.CreateSalonRequest(name="bench", time_zone="Europe/Istanbul"), metadata=admin)
    slots: list[pb.Slot] = []
    for _ in range(n_resources):
        r = await stub.CreateResource(pb.CreateResourceRequest(salon_id=salon.id, name="chair"), metadata=admin)
        spans = [(start + timedelta(minutes=minutes * i), start + timedelta(minutes=minutes * (i + 1)))
                 for i in range(per_resource)]
        for k in range(0, len(spans), 1000):
            req = pb.BatchCreateSlotsRequest(salon_id=salon.id, slots=[
                pb.SlotInput(resource_id=r.id, start_time=ts(s), end_time=ts(e),
                             price=common_pb2.Money(currency_code="TRY", amount_minor=50000))
                for s, e in spans[k:k + 1000]])
            slots.extend((await stub.BatchCreateSlots(req, metadata=admin, timeout=60)).slots)
    return slots


def grpc_holder(clients: Clients, slots: list[pb.Slot], tag: str):
    stubs, md = clients.holds, clients.md

    async def op(i: int) -> None:
        # a fresh customer per hold: the 3-active-holds cap is per customer
        await stubs[i % len(stubs)].HoldSlot(pb.HoldSlotRequest(
            slot_id=slots[i].id, customer_id=f"{tag}-{i}", request_id=f"{tag}-{i}"), timeout=30, metadata=md)
    return op


def raw_inserter(pool, slots: list[pb.Slot], tag: str):
    rows = [(uuid.UUID(s.id), uuid.UUID(s.salon_id), uuid.UUID(s.resource_id),
             s.start_time.ToDatetime(tzinfo=timezone.utc), s.end_time.ToDatetime(tzinfo=timezone.utc)) for s in slots]

    async def op(i: int) -> None:
        slot_id, salon_id, resource_id, start, end = rows[i]
        got = await pool.fetchval(RAW_INSERT, uuid.uuid4(), slot_id, salon_id, resource_id, f"{tag}-{i}", f"{tag}-{i}",
                                  start, end, 50000, "TRY", TEST_MERCHANT)
        assert got is not None
    return op


def fn_taker(pool, slots: list[pb.Slot], tag: str):
    ids = [uuid.UUID(s.id) for s in slots]

    async def op(i: int) -> None:
        r = await pool.fetchrow(TAKE_HOLD, uuid.uuid4(), ids[i], f"{tag}-{i}", f"{tag}-{i}")
        assert r["outcome"] == "held", r["outcome"]
    return op


@dataclasses.dataclass
class Clients:
    """Stubs to one booking process, as its real callers reach it: holds from the orchestrator's
    identity (one stub per connection), the catalogue from the gateway's."""
    holds: list[booking_pb2_grpc.BookingServiceStub]
    catalog: booking_pb2_grpc.BookingServiceStub
    md: tuple  # per call: the declared caller on a plaintext server, nothing with mutual TLS
    admin: tuple = ()  # an admin user's signed assertion (+ the gateway's declared identity in plaintext)


class Server:
    """A booking process; `secure=False` runs it on plaintext gRPC (CUTY_TLS=off) for comparison."""

    def __init__(self, dsn: str, workdir: pathlib.Path, name: str, *, secure: bool = True, **env):
        self.port = free_port()
        self.pki = dev_pki(workdir)
        trust = self.pki.env("booking")
        self.secure = secure
        self.proc = ServiceProcess("booking", base_env(
            # one connection more than it warms: the hot-slot listener keeps one of its own
            CUTY_BOOKING_DATABASE_URL=dsn, CUTY_BOOKING_GRPC_PORT=self.port, CUTY_DB_POOL_MIN=POOL,
            CUTY_DB_POOL_MAX=POOL + 1, CUTY_SWEEP_INTERVAL_SECONDS=3600, CUTY_LOG_LEVEL="WARNING",
            **(trust if secure else {"CUTY_TLS": "off"}), **env),
            workdir / f"{name}.log", grpc_port=self.port)
        self.channels: list[grpc.aio.Channel] = []

    def transport(self, identity: str) -> Transport:
        return Transport(identity, self.pki.files(identity)) if self.secure else Transport.plaintext(identity)

    async def __aenter__(self) -> Clients:
        self.proc.start()
        await self.proc.wait_healthy(60)
        addr = f"127.0.0.1:{self.port}"
        # Long-lived channels, as in production (no handshake per call); separate subchannels
        # (TCP connections), like several client replicas.
        saga = self.transport("payments")
        self.channels = [saga.channel(addr, "booking", options=[("grpc.use_local_subchannel_pool", 1)])
                         for _ in range(CHANNELS)]
        gateway = self.transport("gateway")
        self.channels.append(gateway.channel(addr, "booking"))
        self.catalog_md = gateway.metadata()
        return Clients([booking_pb2_grpc.BookingServiceStub(c) for c in self.channels[:CHANNELS]],
                       booking_pb2_grpc.BookingServiceStub(self.channels[-1]), saga.metadata(),
                       admin=user("bench-admin", "admin", service="booking", pki=self.pki) + gateway.metadata())

    async def __aexit__(self, *exc) -> None:
        for c in self.channels:
            await c.close()
        self.proc.stop()


async def uncontended(dsn: str, workdir: pathlib.Path, pool, results: list[Result]) -> None:
    """The four variants take turns in short rounds, so that load from anything else on the machine
    falls on all of them alike."""
    per_resource, rounds = 250, 5
    chunk = N // rounds
    deployed_server = Server(dsn, workdir, "instrumented")
    bare_server = Server(dsn, workdir, "bare", OTEL_SDK_DISABLED="true", CUTY_METRICS="off")
    plaintext_server = Server(dsn, workdir, "plaintext", secure=False)
    async with deployed_server as deployed, bare_server as bare, plaintext_server as plaintext:
        slots = await seed(deployed, -(-(3 * WARMUP + 5 * N) // per_resource), per_resource, days_ahead(2))
        for k, stubs in enumerate((deployed, bare, plaintext)):
            await closed_loop(grpc_holder(stubs, slots[k * WARMUP:(k + 1) * WARMUP], f"warm{k}"),
                              concurrency=IN_FLIGHT, total=WARMUP)
        rest = slots[3 * WARMUP:]
        variants = {
            "deployed": lambda part, tag: grpc_holder(deployed, part, tag),
            "plaintext": lambda part, tag: grpc_holder(plaintext, part, tag),
            "bare": lambda part, tag: grpc_holder(bare, part, tag),
            "function": lambda part, tag: fn_taker(pool, part, tag),
            "insert": lambda part, tag: raw_inserter(pool, part, tag),
        }
        servers = {"deployed": deployed_server, "plaintext": plaintext_server, "bare": bare_server}

        def turns(k: int, name: str, make):
            def round_of(r: int):
                part = rest[(k * rounds + r) * chunk:(k * rounds + r + 1) * chunk]
                return make(part, f"{name}{r}"), chunk
            return round_of
        runs, server_cpu = await in_turns(
            {name: turns(k, name, make) for k, (name, make) in enumerate(variants.items())}, rounds=rounds,
            concurrency=IN_FLIGHT, pids={name: s.proc.proc.pid for name, s in servers.items()})
    raw = merged(runs["insert"])

    def cpu_ms(name: str) -> float:
        return round(1000 * server_cpu[name] / max(1, merged(runs[name]).ops), 3)
    results.append(merged(runs["deployed"]).result(
        "a: HoldSlot over gRPC (as deployed)", IN_FLIGHT, limit=raw,
        notes="target >= 2000/s, p99 <= 60 ms, ratio >= 0.3", server_cpu_ms_per_op=cpu_ms("deployed")))
    results.append(merged(runs["plaintext"]).result(
        "a: HoldSlot over gRPC, plaintext (CUTY_TLS=off)", IN_FLIGHT, limit=raw,
        notes="what mutual TLS costs: target deployed >= 0.85 x this", server_cpu_ms_per_op=cpu_ms("plaintext")))
    results.append(merged(runs["bare"]).result(
        "a: HoldSlot over gRPC, OTEL_SDK_DISABLED + CUTY_METRICS=off", IN_FLIGHT, limit=raw,
        notes="what metrics and tracing cost: target deployed >= 0.85 x this", server_cpu_ms_per_op=cpu_ms("bare")))
    results.append(merged(runs["function"]).result(
        "a: booking_take_hold() via raw asyncpg", IN_FLIGHT, limit=raw, notes="HoldSlot's statement without gRPC"))
    results.append(raw.result("a: the same INSERT via raw asyncpg", IN_FLIGHT, notes=f"pool of {POOL} connections"))
    # The contract's rules on every HoldSlot (the server's interceptor): their cost beside the
    # booking process's CPU per HoldSlot measured above (target: at most 5 %).
    sample = pb.HoldSlotRequest(slot_id=str(uuid.uuid4()), customer_id="bench-customer", request_id=str(uuid.uuid4()))
    results.append(contract_check_cost("a: HoldSlotRequest's contract check (cutylib.validation)", sample,
                                       cpu_ms("deployed")))


async def hot_slot_grpc(stubs, results: list[Result]) -> None:
    slots = await seed(stubs, 4, 16, days_ahead(30), minutes=60)
    hot = slots[5]
    outcome = {"won": 0, "lost_with_alternatives": 0, "lost_without": 0, "other": 0}

    async def op(i: int) -> None:
        try:
            await stubs.holds[i % len(stubs.holds)].HoldSlot(pb.HoldSlotRequest(
                slot_id=hot.id, customer_id=f"hot-{i}", request_id=f"hot-{i}"), timeout=30, metadata=stubs.md)
            outcome["won"] += 1
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                outcome["other"] += 1
                raise
            alts = unpack_detail(e, pb.SlotUnavailable)
            outcome["lost_with_alternatives" if alts and alts.alternatives else "lost_without"] += 1

    run = await closed_loop(op, concurrency=HOT, total=HOT)
    ok = outcome["won"] == 1 and outcome["lost_with_alternatives"] == HOT - 1
    print(f"(b) hot slot over gRPC: {HOT} calls all answered in {run.seconds:.2f} s (target <= 2 s); "
          f"{outcome}; {'OK' if ok else 'WRONG'}")
    results.append(run.result(f"b: hot slot, {HOT} x HoldSlot over gRPC", HOT,
                              notes=f"all answered in {run.seconds:.2f} s; won={outcome['won']}, "
                                    f"lost with alternatives={outcome['lost_with_alternatives']}",
                              all_answered_s=round(run.seconds, 3), **outcome))


async def hot_slot_db(stubs, pool, results: list[Result]) -> None:
    """(b) and (c) side by side on the database alone: the one-statement take vs lock-check-insert,
    1,000 racers each (through the same pool), on a hot slot with free neighbours."""
    won = {"optimistic": 0, "pessimistic": 0}
    hot = uuid.UUID((await seed(stubs, 4, 16, days_ahead(40), minutes=60))[5].id)
    phot = uuid.UUID((await seed(stubs, 4, 16, days_ahead(40), minutes=60))[5].id)

    async def optimistic(i: int) -> None:
        r = await pool.fetchrow(TAKE_HOLD, uuid.uuid4(), hot, f"opt-{i}", f"opt-{i}")
        if r["outcome"] == "held":
            won["optimistic"] += 1
        else:
            assert r["outcome"] == "taken" and r["alternatives"], r["outcome"]

    async def pessimistic(i: int) -> None:
        async with pool.acquire() as conn:
            async with conn.transaction():
                s = await conn.fetchrow(LOCK_SLOT, phot)
                lost = await conn.fetchval(BUSY, s["resource_id"], s["start_time"], s["end_time"], s["merchant_id"])
                if not lost:
                    await conn.execute(RAW_INSERT, uuid.uuid4(), s["id"], s["salon_id"], s["resource_id"],
                                       f"pes-{i}", f"pes-{i}", s["start_time"], s["end_time"], s["price_minor"],
                                       s["currency"], s["merchant_id"])
                    won["pessimistic"] += 1
            if lost:
                alts = await conn.fetch(ALTERNATIVES, s["salon_id"], s["id"], s["start_time"], s["end_time"],
                                        s["resource_id"], s["merchant_id"])
                assert alts

    opt = await closed_loop(optimistic, concurrency=HOT, total=HOT)
    pes = await closed_loop(pessimistic, concurrency=HOT, total=HOT)
    print(f"(b/c) on the database, {HOT} racers: one statement {opt.seconds:.2f} s (winners {won['optimistic']}); "
          f"FOR UPDATE, check, insert {pes.seconds:.2f} s (winners {won['pessimistic']})")
    results.append(opt.result(f"b: hot slot, {HOT} x booking_take_hold() via asyncpg", HOT, limit=pes,
                              notes=f"limit = (c); winners={won['optimistic']}"))
    results.append(pes.result(f"c: hot slot, {HOT} x FOR UPDATE + check + INSERT", HOT,
                              notes=f"losers then query alternatives; winners={won['pessimistic']}"))


async def main() -> None:
    pg = bench_postgres()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="cuty-bench-booking-"))
    dsn = with_database(pg.dsn, "cuty_booking")
    results: list[Result] = []
    try:
        t0 = time.perf_counter()
        async with Server(dsn, workdir, "migrate"):
            pass  # the server migrates its database when it starts
        # Raw asyncpg, as the superuser: no merchant to say, no transaction around each statement.
        pool = await create_pool(dsn, min_size=POOL, max_size=POOL)
        try:
            await uncontended(dsn, workdir, pool, results)
            # (b) measures how the race is decided with every racer admitted, so this server takes
            # all HOT calls at once; as deployed, calls beyond CUTY_GRPC_MAX_CONCURRENT_RPCS are
            # answered RESOURCE_EXHAUSTED at once instead (tests/integration/libs/test_overload.py).
            async with Server(dsn, workdir, "hot", CUTY_GRPC_MAX_CONCURRENT_RPCS=HOT) as stubs:
                await hot_slot_grpc(stubs, results)
                await hot_slot_db(stubs, pool, results)
        finally:
            await pool.close()
        print(f"bench took {time.perf_counter() - t0:.1f} s; server logs in {workdir}")
        report("booking", results)
    finally:
        pg.close()


if __name__ == "__main__":
    asyncio.run(main())
