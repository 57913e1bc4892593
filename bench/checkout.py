"""Checkout benchmark (`make bench-checkout`): end-to-end purchases through the real processes.

One op = a purchase until COMPLETED, for a slot and for one code, at 16 and 64 concurrent buyers,
in two flows measured side by side (alternated in rounds) on the deployed stack: two-call
(CreateCheckout, then PayCheckout(pm_card_ok)) and one-call (CreateCheckout with the payment
method). Either normally answers COMPLETED itself: the confirm step runs inline after a synchronous
capture. Latency is create -> COMPLETED as the buyer sees it. The table at the end compares the
flows: throughput, p50 / p99, CPU per checkout of all processes, and one-call's CPU over two-call's.

The limit beside each row is the same remote work done directly, without the orchestrator, at the
same concurrency: HoldSlot / PSP create intent / ConfirmHold (codes: ReserveCodes /
PSP / DeliverCodes), so the ratio is what the saga's bookkeeping (idempotency key, saga row,
transitions, timeline, payment row and finalize) costs on top of the calls it must make anyway.

Where the time goes: per-step durations from the payment timeline (every saga transition carries
its step's duration, every payment event its time) and the CPU seconds each process used per
checkout (from /proc), printed after the table. All processes and Postgres share this machine.

BENCH_SECONDS (default 8) sets each measured run's length; BENCH_CONCURRENCY="16,64";
BENCH_KINDS="booking,codes"; BENCH_FLOWS="two-call,one-call"; BENCH_ROUNDS (default 2).
The stack's own background work (workers' polls, listeners, Postgres' housekeeping, the idle
plaintext stack beside it) costs CPU every second whatever the buyers do; counted per checkout it
weighs more on whichever flow happened to complete fewer checkouts a second (on a loaded machine,
by a factor). So every measured run is preceded by an idle window (BENCH_IDLE_SECONDS, default 1 s,
after 0.5 s for the previous run's tail to settle) whose CPU rate, times the run's length, is the
run's background: the table prints CPU per checkout as measured (`raw`) and net of it (`net`), and
both ratios. Before the rounds of each kind and concurrency, every way runs unmeasured for
BENCH_WARMUP_SECONDS (default 1), so the first measured run does not carry the warm-up alone.
BENCH_STATEMENTS=1: the bench's cluster runs with pg_stat_statements (restarted with it preloaded;
it costs some CPU, so the CPU figures of such a run are not the reference), and every flow's
statements are printed per checkout: calls and mean ms by database and statement.
BENCH_VIA (default `both`): how the deployed side's buyers reach the checkout. `grpc`: straight to
payments over gRPC. `gateway`: through the HTTP gateway, as real buyers do (its CPU counted with the
rest; JSON over HTTP/1.1 keep-alive, a customer token each; the gateway's admission control and rate
limits off, so that both flows do all their work): two-call is then two HTTP requests and one-call
one. `both`: each flow both ways in one run, all four alternated in every round, and the one-call /
two-call table printed for each way. With the gateway running, the PSP's webhooks reach payments
through it (its route for them) in every round, the direct ones too, as deployed.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone

from _common import Http, Run, all_cpu, bench_postgres, closed_loop, merged, percentile, report

import asyncpg
import grpc
import jwt

from cuty.booking.v1 import booking_pb2 as bpb, booking_pb2_grpc
from cuty.codepool.v1 import codepool_pb2 as cpb, codepool_pb2_grpc
from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2 as pb, checkout_pb2_grpc
from cutylib.config import DEV_JWT_SECRET, with_database
from cutylib.timestamps import to_timestamp
from booking.grpc_api import CALLERS as BOOKING_CALLERS
from codepool.grpc_api import CALLERS as CODEPOOL_CALLERS
from cutylib.testing.stack import Stack
from cutylib.testing.trust import acting_channel, user
from payments.checkout.grpc_api import CALLERS as CHECKOUT_CALLERS
from payments.psp import PspClient

SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
CONCURRENCY = [int(c) for c in os.environ.get("BENCH_CONCURRENCY", "16,64").split(",")]
KINDS = os.environ.get("BENCH_KINDS", "booking,codes").split(",")
# The flows measured side by side on the deployed (mTLS) stack, alternated in BENCH_ROUNDS rounds
# of BENCH_SECONDS / rounds each: two-call (CreateCheckout, then PayCheckout) and one-call
# (CreateCheckout with a payment method).
FLOWS = os.environ.get("BENCH_FLOWS", "two-call,one-call").split(",")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
SLOTS_PER_RUN = int(os.environ.get("BENCH_SLOTS", "3000"))
VIA = os.environ.get("BENCH_VIA", "both")
if VIA not in ("grpc", "gateway", "both"):
    raise SystemExit(f"BENCH_VIA must be grpc, gateway or both, got {VIA!r}")
# How the deployed side's buyers reach the checkout: straight to payments over gRPC, or through the
# HTTP gateway.
PATHS = ["grpc", "gateway"] if VIA == "both" else [VIA]
# What is measured side by side: every flow by every path, (path, flow).
WAYS = [(path, flow) for path in PATHS for flow in FLOWS]


def label(way: tuple[str, str]) -> str:
    path, flow = way
    return f"{flow} via the gateway" if path == "gateway" else flow
STATEMENTS = os.environ.get("BENCH_STATEMENTS") == "1"
IDLE_SECONDS = float(os.environ.get("BENCH_IDLE_SECONDS", "1"))
WARMUP_SECONDS = float(os.environ.get("BENCH_WARMUP_SECONDS", "1"))
GATEWAY_ENV = {"CUTY_GATEWAY_CONCURRENCY_MAX": 0, "CUTY_GATEWAY_ACCESS_LOG": "0",
               "CUTY_GATEWAY_RATE_PER_SECOND": 1_000_000, "CUTY_GATEWAY_RATE_BURST": 1_000_000,
               "CUTY_GATEWAY_ADDRESS_RATE_PER_SECOND": 1_000_000, "CUTY_GATEWAY_ADDRESS_RATE_BURST": 1_000_000}
ENV = {
    "CUTY_LOG_LEVEL": "WARNING",  # JSON logs of every transition cost CPU the buyers would not see
    "CUTY_PSP_LOG_LEVEL": "WARNING",  # the PSP simulator reads its own variable (3 INFO lines a checkout)
    # Production-like tracing: 1 % of traces sampled (an unsampled span costs next to nothing).
    "OTEL_TRACES_SAMPLER": os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
    "OTEL_TRACES_SAMPLER_ARG": os.environ.get("OTEL_TRACES_SAMPLER_ARG", "0.01"),
    "CUTY_MAX_ACTIVE_HOLDS": 1000,
    "CUTY_DB_POOL_MAX": 40,
}


class Catalogue:
    """Slots (one hour each, never overlapping) and products with codes, created up front."""

    def __init__(self, booking, codepool):
        self.booking, self.codepool = booking, codepool
        self.slots: list[str] = []
        self.products: list[str] = []

    async def make_slots(self, n: int) -> None:
        salon = await self.booking.CreateSalon(bpb.CreateSalonRequest(name="Bench", time_zone="Europe/Istanbul"),
                                               metadata=ADMIN)
        base = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + timedelta(days=1)
        per_resource = 2000
        for r in range((n + per_resource - 1) // per_resource):
            res = await self.booking.CreateResource(bpb.CreateResourceRequest(salon_id=salon.id, name=f"Chair {r}"),
                                                    metadata=ADMIN)
            for start in range(0, min(per_resource, n - r * per_resource), 500):
                batch = [bpb.SlotInput(resource_id=res.id, start_time=to_timestamp(base + timedelta(hours=h)),
                                       end_time=to_timestamp(base + timedelta(hours=h + 1)),
                                       price=common_pb2.Money(currency_code="TRY", amount_minor=75000))
                         for h in range(start, min(start + 500, per_resource, n - r * per_resource))]
                out = await self.booking.BatchCreateSlots(bpb.BatchCreateSlotsRequest(salon_id=salon.id, slots=batch),
                                                          timeout=60, metadata=ADMIN)
                self.slots += [s.id for s in out.slots]

    async def make_product(self, codes: int) -> str:
        p = await self.codepool.CreateProduct(cpb.CreateProductRequest(
            sku=f"bench-{uuid.uuid4().hex[:8]}", name="Bench card",
            price=common_pb2.Money(currency_code="TRY", amount_minor=2500)), metadata=ADMIN)
        for start in range(0, codes, 5000):
            await self.codepool.ImportCodeBatch(cpb.ImportCodeBatchRequest(
                product_id=p.id, batch_ref=f"b{start}-{uuid.uuid4().hex[:6]}",
                codes=[f"BENCH-{uuid.uuid4().hex}" for _ in range(min(5000, codes - start))]), timeout=120,
                metadata=ADMIN)
        return p.id


class Side:
    """One whole stack and its clients: mutual TLS as deployed, or plaintext (CUTY_TLS=off)."""

    def __init__(self, server, work: str, secure: bool):
        self.secure = secure
        self.name = "mTLS" if secure else "plaintext"
        suffix = uuid.uuid4().hex[:6]
        self.dbs = {s: with_database(server.dsn, f"cuty_{s}_bench_{suffix}") for s in ("booking", "codepool", "payments")}
        env = {**ENV, **{f"CUTY_{s.upper()}_DATABASE_URL": d for s, d in self.dbs.items()}}
        if not secure:
            env["CUTY_TLS"] = "off"
        self.via_gateway = secure and VIA in ("gateway", "both")
        if self.via_gateway:
            env.update(GATEWAY_ENV)
            self.name += " with the gateway"
        self.stack = Stack(server.dsn, os.path.join(work, self.name), env=env, gateway=self.via_gateway)
        self.channels = []

    async def start(self, n_slots: int, n_products: int) -> "Side":
        await self.stack.start()
        st, secure = self.stack, self.secure
        # Long-lived channels, as the gateway and the orchestrator keep them: no handshake per call.
        ch = acting_channel(st.payments_addrs[0], "payments", CHECKOUT_CALLERS, secure=secure)
        bch = acting_channel(st.booking_addr, "booking", BOOKING_CALLERS, secure=secure)
        cch = acting_channel(st.codepool_addr, "codepool", CODEPOOL_CALLERS, secure=secure)
        self.channels += [ch, bch, cch]
        self.api = checkout_pb2_grpc.CheckoutServiceStub(ch)
        self.booking, self.codepool = booking_pb2_grpc.BookingServiceStub(bch), codepool_pb2_grpc.CodePoolServiceStub(cch)
        self.cat = Catalogue(self.booking, self.codepool)
        await self.cat.make_slots(n_slots)
        self.products = [await self.cat.make_product(SLOTS_PER_RUN) for _ in range(n_products)]
        self.slot_iter = iter(self.cat.slots)
        self.pay_db = await asyncpg.create_pool(self.dbs["payments"], min_size=1, max_size=2)
        return self

    async def stop(self) -> None:
        for c in self.channels:
            await c.close()
        if getattr(self, "pay_db", None) is not None:
            await self.pay_db.close()
        await self.stack.stop()


async def main() -> None:
    server = bench_postgres()
    work = tempfile.mkdtemp(prefix="cuty-bench-checkout-")
    stmts = await Statements.start(server) if STATEMENTS else None
    sides = [Side(server, work, secure=True), Side(server, work, secure=False)]
    try:
        t0 = time.perf_counter()
        for side in sides:
            # Per concurrency the mTLS side runs each flow and the direct limit, the plaintext side
            # the two-call flow; a product per kind, concurrency and flow.
            await side.start(SLOTS_PER_RUN * len(CONCURRENCY) * (len(FLOWS) * len(PATHS) + 1),
                             len(KINDS) * len(CONCURRENCY) * len(FLOWS) * len(PATHS))
        print(f"catalogue: {len(sides[0].cat.slots)} slots per stack in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        # The PSP client the orchestrator uses (payments/psp.py), so the limit pays what it pays.
        psp = PspClient(sides[0].stack.psp_url, timeout=10, retries=0, max_connections=200)
        results, profiles, flows = [], [], []
        for kind in KINDS:
            for conc in CONCURRENCY:
                secure, plain = sides
                # mTLS, as deployed: the flows alternated in rounds, so drift of the machine hits both.
                measured = {way: [] for way in WAYS}
                statements_of = {way: {} for way in WAYS}
                cpu_of = {way: {} for way in WAYS}
                idle_of = {way: {} for way in WAYS}
                done_of = {way: [] for way in WAYS}
                products = {way: secure.products.pop() for way in WAYS}
                for way in WAYS if WARMUP_SECONDS > 0 else ():
                    # Unmeasured: the first run after a pause would otherwise carry the processes'
                    # warm-up (connections, caches) into whichever way comes first.
                    await closed_loop(buyer(kind, way[1], secure, products[way], [], http=way[0] == "gateway"),
                                      concurrency=conc, duration=WARMUP_SECONDS)
                for rnd in range(ROUNDS):
                    for way in (WAYS if rnd % 2 == 0 else WAYS[::-1]):
                        path, flow = way
                        tag = f"{kind}-{conc}-{flow}-{path}-{rnd}"
                        spy = pyspy(secure.stack.procs["payments-0"].proc.pid, work, tag)
                        if stmts is not None:
                            await stmts.reset()
                        run, cpu, idle = await measure(secure, server, buyer(kind, flow, secure, products[way],
                                                                             done_of[way], http=path == "gateway"),
                                                       conc, SECONDS / ROUNDS)
                        if stmts is not None:
                            await stmts.take(secure.dbs, statements_of[way])
                        if spy is not None:
                            print(spy.summary(), file=sys.stderr)
                        measured[way].append(run)
                        for n, v in cpu.items():
                            cpu_of[way][n] = cpu_of[way].get(n, 0.0) + v
                            idle_of[way][n] = idle_of[way].get(n, 0.0) + idle.get(n, 0.0)
                limit = await direct(kind, conc, secure.booking, secure.codepool, psp, secure.slot_iter,
                                     products[WAYS[0]])
                per_flow = {}
                for way in WAYS:
                    run = merged(measured[way])
                    per_op = per_checkout(cpu_of[way], run.ops)
                    net = per_checkout(net_of(cpu_of[way], idle_of[way]), run.ops)
                    profile = await step_profile(secure.pay_db, done_of[way])
                    per_flow[way] = (run, per_op, net)
                    results.append(run.result(f"{kind} {label(way)}->COMPLETED (mTLS, as deployed)", conc, limit=limit,
                                              notes="limit: the same remote calls without the orchestrator",
                                              steps_p50_ms=profile, cpu_ms_per_checkout=per_op,
                                              cpu_net_ms_per_checkout=net))
                    profiles.append((f"{kind}/{label(way)}/mTLS", conc, profile, per_op))
                flows.append((kind, conc, per_flow))
                if stmts is not None:
                    Statements.print(kind, conc, {label(w): (statements_of[w], per_flow[w][0].ops) for w in WAYS})
                # Plaintext gRPC beside it (the two-call flow): the ratio is what mTLS costs.
                done: list[str] = []
                run, cpu, _ = await measure(plain, server, buyer(kind, "two-call", plain, plain.products.pop(), done),
                                         conc, SECONDS)
                per_op = per_checkout(cpu, run.ops)
                results.append(run.result(f"{kind} two-call->COMPLETED (plaintext gRPC)", conc,
                                          limit=merged(measured[(PATHS[0], "two-call")])
                                          if (PATHS[0], "two-call") in measured else None,
                                          notes="limit: the mTLS two-call run beside it; ratio > 1 is what mTLS costs "
                                                "(target <= 1.15)", cpu_ms_per_checkout=per_op))
                profiles.append((f"{kind}/two-call/plaintext", conc, await step_profile(plain.pay_db, done), per_op))
        report("checkout", results)
        print("\nwhere the time goes (p50 ms per step from the payment timeline; CPU ms per checkout per process):")
        for name, conc, profile, per_op in profiles:
            print(f"  {name:28} @{conc:<3} steps {profile}")
            print(f"  {'':28}      cpu   {per_op}")
        print_flows(flows)
        await psp.aclose()
    finally:
        for side in sides:
            await side.stop()
        if stmts is not None:
            await stmts.close()
        server.close()


def buyer(kind: str, flow: str, side: Side, product: str, done: list[str], http: bool = False):
    """One buyer's purchase: CreateCheckout + PayCheckout (two-call), or CreateCheckout with the
    payment method (one-call), until COMPLETED; through the gateway when `http`."""
    api, slot_iter = side.api, side.slot_iter
    if http:
        return http_buyer(kind, flow, side, product, done)

    async def purchase(i: int) -> None:
        me = f"bench-{uuid.uuid4().hex[:12]}"
        req = (pb.CreateCheckoutRequest(slot_id=next(slot_iter)) if kind == "booking"
               else pb.CreateCheckoutRequest(product_id=product, quantity=1))
        if flow == "one-call":
            req.payment_method = "pm_card_ok"
            paid = await api.CreateCheckout(req, metadata=_md(me), timeout=10)
        else:
            c = await api.CreateCheckout(req, metadata=_md(me), timeout=10)
            paid = await api.PayCheckout(pb.PayCheckoutRequest(checkout_id=c.id, payment_method="pm_card_ok"),
                                         metadata=_md(me), timeout=10)
        while paid.state != pb.CHECKOUT_STATE_COMPLETED:  # only if the inline confirm was deferred
            if paid.state not in (pb.CHECKOUT_STATE_CHARGING, pb.CHECKOUT_STATE_CONFIRMING):
                raise RuntimeError(f"checkout {paid.id} ended {pb.CheckoutState.Name(paid.state)}")
            await asyncio.sleep(0.01)
            paid = await api.GetCheckout(pb.GetCheckoutRequest(checkout_id=paid.id), metadata=_md(me))
        done.append(paid.id)
    return purchase


async def measure(side: Side, server, purchase, conc: int, seconds: float
                  ) -> tuple[Run, dict[str, float], dict[str, float]]:
    """One closed-loop run: the CPU seconds every process (and Postgres, and this client) used in
    it, and what they would have used idle for as long (the rate of an idle window just before)."""
    await asyncio.sleep(0.5)  # the previous run's tail (its last webhooks) settles
    idle0, t0 = all_cpu(side.stack, server, client="client+relay"), time.perf_counter()
    await asyncio.sleep(IDLE_SECONDS)
    idle1, t1 = all_cpu(side.stack, server, client="client+relay"), time.perf_counter()
    run = await closed_loop(purchase, concurrency=conc, duration=seconds)
    cpu2, t2 = all_cpu(side.stack, server, client="client+relay"), time.perf_counter()
    scale = (t2 - t1) / (t1 - t0)
    return (run, {n: s - idle1[n] for n, s in cpu2.items()},
            {n: max(0.0, idle1[n] - idle0.get(n, idle1[n])) * scale for n in cpu2})


def net_of(cpu: dict[str, float], idle: dict[str, float]) -> dict[str, float]:
    """CPU seconds net of the background (never below zero per process)."""
    return {n: max(0.0, s - idle.get(n, 0.0)) for n, s in cpu.items()}


def per_checkout(cpu: dict[str, float], ops: int) -> dict[str, float]:
    per_op = {n: round(1000 * s / max(1, ops), 2) for n, s in cpu.items() if s > 0}
    per_op["total"] = round(sum(per_op.values()), 2)
    return per_op


def print_flows(flows) -> None:
    """The flows side by side: throughput, latency, CPU per checkout of all processes (as measured,
    and net of the stack's idle CPU), and the ratio of one-call's CPU to two-call's (target <= 0.75),
    for each way the buyers came (straight to payments over gRPC, through the gateway)."""
    if not {"one-call", "two-call"} <= set(FLOWS):
        return
    for path in PATHS:
        print(f"\none-call vs two-call ({'through the gateway' if path == 'gateway' else 'gRPC straight to payments'}"
              ", mTLS, as deployed; CPU ms per checkout of all processes, raw / net of the idle stack's CPU):")
        print_ratios(path, flows)


def print_ratios(path: str, flows) -> None:
    for kind, conc, all_ways in flows:
        per_flow = {flow: all_ways[(path, flow)] for flow in ("two-call", "one-call")}
        (_, one_cpu, one_net), (_, two_cpu, two_net) = per_flow["one-call"], per_flow["two-call"]
        rows = []
        for flow in ("two-call", "one-call"):
            run, cpu, net = per_flow[flow]
            lat = sorted(run.latencies_ms)
            rows.append(f"{flow} {run.ops_per_s:.1f}/s p50 {percentile(lat, 0.5):.1f} ms p99 {percentile(lat, 0.99):.1f} ms "
                        f"cpu {cpu['total']:.2f} / {net['total']:.2f} ms")
        ratio = one_cpu["total"] / two_cpu["total"] if two_cpu["total"] else float("nan")
        net_ratio = one_net["total"] / two_net["total"] if two_net["total"] else float("nan")
        print(f"  {kind:8} @{conc:<3} {' | '.join(rows)} | one/two CPU raw {ratio:.3f}, net {net_ratio:.3f} "
              "(target <= 0.75)")
        for n in sorted(set(one_cpu) | set(two_cpu)):
            if n != "total":
                print(f"  {'':13} {n:14} two-call {two_cpu.get(n, 0):6.2f} / {two_net.get(n, 0):6.2f}  "
                      f"one-call {one_cpu.get(n, 0):6.2f} / {one_net.get(n, 0):6.2f} ms")


class pyspy:
    """BENCH_PYSPY=1 and py-spy installed: sample the orchestrator during the run and print where
    its CPU goes (self time by function, and shares by library)."""

    GROUPS = ("site-packages/asyncpg", "site-packages/grpc", "site-packages/opentelemetry", "lib/python3.11/logging",
              "site-packages/aiohttp", "site-packages/httpx", "site-packages/httpcore", "site-packages/google", "payments/checkout",
              "payments/service", "payments/psp", "lib/python3.11/asyncio", "lib/python3.11/json", "cutylib")

    def __new__(cls, pid: int, work: str, tag: str):
        import shutil
        import subprocess

        exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        if not os.environ.get("BENCH_PYSPY") or not os.path.exists(exe):
            return None
        self = super().__new__(cls)
        self.out = os.path.join(work, f"pyspy-{tag}.txt")
        self.proc = subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(int(SECONDS)), "-r", "200",
                                      "--format", "raw", "--full-filenames", "-o", self.out,
                                      "--nonblocking"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def summary(self, top: int = 15) -> str:
        from collections import Counter

        self.proc.wait(30)
        own, groups, total = Counter(), Counter(), 0
        for line in open(self.out):
            stack, _, n = line.rstrip().rpartition(" ")
            n = int(n)
            total += n
            frames = stack.split(";")
            own[frames[-1].split("site-packages/")[-1].split("python3.11/")[-1][:110]] += n
            for g in self.GROUPS:
                if any(g in f for f in frames):
                    groups[g] += n
        lines = [f"py-spy: {total} samples of the orchestrator; inclusive share by library:"]
        lines += [f"  {g:22} {100 * c / total:5.1f}%" for g, c in groups.most_common()]
        lines += ["  top self time:"] + [f"  {100 * c / total:5.1f}%  {f}" for f, c in own.most_common(top)]
        return "\n".join(lines)


class Statements:
    """pg_stat_statements over the measured runs (BENCH_STATEMENTS=1): what each flow asks of each
    database per checkout, by statement (calls and mean execution ms)."""

    @classmethod
    async def start(cls, server) -> "Statements":
        conn = await asyncpg.connect(server.dsn)
        await conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        await conn.close()
        server.cluster.stop()
        server.cluster.start()
        self = cls()
        self.conn = await asyncpg.connect(server.dsn)
        await self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return self

    async def reset(self) -> None:
        await self.conn.execute("SELECT pg_stat_statements_reset()")

    async def take(self, dbs: dict[str, str], into: dict) -> None:
        """Adds the statements run since the reset in the side's databases to `into`."""
        names = {d.rsplit("/", 1)[1].split("?")[0]: svc for svc, d in dbs.items()}
        for r in await self.conn.fetch(
                "SELECT d.datname, s.query, s.calls, s.total_exec_time FROM pg_stat_statements s "
                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = ANY($1::text[])", list(names)):
            # One statement may have several entries (its constants shown as $n in one, as written in
            # another: e.g. another role or a nested level); their texts agree once constants are `?`.
            text = re.sub(r"\$\d+|'[^']*'|\b\d+\b", "?", " ".join(r["query"].split()))
            key = (names[r["datname"]], text[:110])
            calls, ms = into.get(key, (0, 0.0))
            into[key] = (calls + r["calls"], ms + r["total_exec_time"])

    @staticmethod
    def print(kind: str, conc: int, by_flow: dict[str, tuple[dict, int]]) -> None:
        print(f"\nstatements per checkout, {kind} @{conc} (pg_stat_statements; calls, mean ms; >= 0.05 calls):")
        for flow, (stats, ops) in by_flow.items():
            per_db: dict[str, float] = {}
            for (db, _), (calls, _ms) in stats.items():
                per_db[db] = per_db.get(db, 0.0) + calls / max(1, ops)
            print(f"  {flow}: {ops} checkouts; statements per checkout "
                  + ", ".join(f"{db} {n:.2f}" for db, n in sorted(per_db.items())))
            for (db, query), (calls, ms) in sorted(stats.items(), key=lambda kv: (kv[0][0], -kv[1][0])):
                if calls / max(1, ops) >= 0.05:
                    print(f"    {db:9} {calls / max(1, ops):5.2f} x {ms / max(1, calls):6.3f} ms  {query}")

    async def close(self) -> None:
        await self.conn.close()


ADMIN = user("bench-admin", "admin")


def http_buyer(kind: str, flow: str, side: Side, product: str, done: list[str]):
    """The same purchase through the gateway: POST /v1/checkouts (with paymentMethod: one-call),
    then POST /v1/checkouts/{id}:pay (two-call), as a customer with a token of their own; one
    keep-alive connection per concurrent buyer."""
    conns: list[Http] = []
    exp = int(time.time()) + 7200

    async def purchase(i: int) -> None:
        conn = conns.pop() if conns else Http(side.stack.http_port)
        token = jwt.encode({"sub": f"bench-{uuid.uuid4().hex[:12]}", "role": "customer", "exp": exp},
                           DEV_JWT_SECRET, algorithm="HS256")
        auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        body = {"slotId": next(side.slot_iter)} if kind == "booking" else {"productId": product, "quantity": 1}
        if flow == "one-call":
            body["paymentMethod"] = "pm_card_ok"
        status, raw = await conn.request("POST", "/v1/checkouts", {**auth, "Idempotency-Key": uuid.uuid4().hex},
                                         json.dumps(body).encode())
        paid = json.loads(raw)
        if status == 200 and flow != "one-call":
            status, raw = await conn.request("POST", f"/v1/checkouts/{paid['id']}:pay",
                                             {**auth, "Idempotency-Key": uuid.uuid4().hex},
                                             b'{"paymentMethod":"pm_card_ok"}')
            paid = json.loads(raw)
        while status == 200 and paid["state"] != "CHECKOUT_STATE_COMPLETED":  # only if the confirm was deferred
            if paid["state"] not in ("CHECKOUT_STATE_CHARGING", "CHECKOUT_STATE_CONFIRMING"):
                raise RuntimeError(f"checkout {paid['id']} ended {paid['state']}")
            await asyncio.sleep(0.01)
            status, raw = await conn.request("GET", f"/v1/checkouts/{paid['id']}", auth)
            paid = json.loads(raw)
        if status != 200:
            conn.close()
            raise RuntimeError(f"HTTP {status}: {raw[:200]!r}")
        conns.append(conn)
        done.append(paid["id"])
    return purchase


def _md(customer: str):
    return (*user(customer, "customer"), ("idempotency-key", str(uuid.uuid4())))


async def direct(kind, conc, booking, codepool, psp, slot_iter, product) -> Run:
    """The limit: the remote calls of one checkout made directly, no orchestrator in between."""
    async def one(i: int) -> None:
        key = str(uuid.uuid4())
        if kind == "booking":
            # No ExtendHold: a buyer paying with more than the pay window left costs none.
            h = await booking.HoldSlot(bpb.HoldSlotRequest(slot_id=next(slot_iter), customer_id=f"d-{key}",
                                                           request_id=key))
        else:
            await codepool.ReserveCodes(cpb.ReserveCodesRequest(order_id=key, order_item_id=key, product_id=product,
                                                                quantity=1, customer_id=f"d-{key}"))
        await psp.create_intent(key, {"amount": 2500, "currency": "TRY", "payment_method": "pm_card_ok"})
        if kind == "booking":
            await booking.ConfirmHold(bpb.ConfirmHoldRequest(hold_id=h.id, payment_ref=key))
        else:
            await codepool.DeliverCodes(cpb.DeliverCodesRequest(order_id=key, payment_transaction_id=key))
    return await closed_loop(one, concurrency=conc, duration=min(SECONDS, 4))


STEPS = """
SELECT checkout_id, payment_id, source, from_status, to_status, note, created_at
FROM payment_events WHERE checkout_id = ANY($1::uuid[]) ORDER BY seq
"""


async def step_profile(pool, checkout_ids: list[str]) -> dict[str, float]:
    """p50 of each step of the checkouts: hold / pay start (+ extension, when the hold had less than
    the pay window left) / PSP charge / record / confirm, from the
    timeline (saga notes carry step durations; the rest are gaps between consecutive events)."""
    sample = checkout_ids[:: max(1, len(checkout_ids) // 500)]
    by_checkout: dict[str, list] = {}
    for r in await pool.fetch(STEPS, sample):
        by_checkout.setdefault(str(r["checkout_id"]), []).append(r)
    spans: dict[str, list[float]] = {}

    def add(name: str, ms: float) -> None:
        spans.setdefault(name, []).append(ms)

    for events in by_checkout.values():
        at = {}
        for e in events:
            at[(e["source"], e["from_status"], e["to_status"])] = e["created_at"]
            took = e["note"].rpartition("; ")[2]  # "[what happened; ]<step> <ms>ms"
            if took.startswith(("hold ", "confirm ")):
                add(took.split()[0], float(took.split()[1].removesuffix("ms")))
        try:
            # A one-call checkout records its hold with its payment's start (PENDING -> CHARGING).
            charging = at.get(("saga", "HELD", "CHARGING")) or at[("saga", "PENDING", "CHARGING")]
            created = at[("sync", None, "created")]
            succeeded = at[("sync", "created", "succeeded")]
        except KeyError:
            continue
        add("start+extend", (created - charging).total_seconds() * 1000)
        add("psp_charge+finalize", (succeeded - created).total_seconds() * 1000)
        # The synchronous capture is recorded with the confirm (CHARGING -> COMPLETED): no separate
        # record of it, unless the confirm did not complete at once (CONFIRMING, as before).
        confirming = at.get(("saga", "CHARGING", "CONFIRMING"))
        if confirming is not None:
            add("record+route", (confirming - succeeded).total_seconds() * 1000)
    return {k: round(statistics.median(v), 2) for k, v in spans.items()}


if __name__ == "__main__":
    asyncio.run(main())
