"""Flash-sale benchmark (`make bench-overload`): open-loop buyers through the gateway, past capacity.

A buyer arrives (Poisson arrivals, one new customer each), creates a checkout (one code, or a slot
of their own), pays it with pm_card_ok and waits until it is COMPLETED; after PATIENCE seconds
(10, as a browser tab) they give up and close their connection, as a person would. A buyer the
platform refuses (429 / 503) leaves at once.

1. Capacity: 16 closed-loop buyers for CAP_SECONDS; completed checkouts per second.
2. For each multiple in BENCH_LOADS (default 1,2,3,5) of that capacity, LOAD_SECONDS of arrivals:
   goodput (checkouts COMPLETED within the buyer's patience, per second) over capacity, p50/p99 of
   those successes, p99 of refusals, and how many gave up.
3. After settling (no checkout left in a non-final state): money. The PSP's captured-minus-refunded
   total must equal the sum of COMPLETED checkouts, whoever gave up when.

Targets: goodput >= 0.9 of capacity at 3x and >= 0.8 at 5x; p99 of successes at 3x <= 2x the p99 at
capacity; refusals answered with p99 <= 50 ms; no money mismatch.

BENCH_KINDS="codes,booking", BENCH_LOADS="1,2,3,5", BENCH_LOAD_SECONDS (20), BENCH_CAP_SECONDS (10),
BENCH_PATIENCE (10), BENCH_ONE_CALL=1 (create-and-pay in one request), BENCH_HOT_BUYERS (1000; 0 = skip),
BENCH_SWEEP (e.g. "4,8,16,32,64"; empty): after capacity, CAP_SECONDS of closed-loop buying at each of
these buyer counts (throughput against concurrency: what the admission limit must let in; with
`CUTY_GATEWAY_CONCURRENCY_MAX=0` nothing is refused); BENCH_LOADS may then be empty.
BENCH_EDGE_PRIORITY (-5; 0 = off): the gateway's nice value, as the weight a deployment's CPU request
gives the edge (needs root; the run says so otherwise).
BENCH_CLIENT_NICE (0): the load generator (this process) lowers its own priority by this much once
the services run, so that on a machine it shares with them it takes CPU only when they leave some.
BENCH_BUYER ("leave"): a refused buyer leaves at once; "retry": waits the answer's Retry-After and
sends the same request again with the same idempotency key while their patience lasts (as
cuty-client does), counted once by how the visit ended.

Per level, where the buyers went: how each visit ended (completed; refused at create or at pay;
gave up at create, pay or poll), each refusal by status, problem type and call, and after settling
what became of the checkouts whose buyers left (COMPLETED: charged after the buyer had gone; HELD:
never paid, its codes or slot locked until the hold expires). The refusal p99 is of each 429/503
answer alone. The load generator's CPU per request is reported beside it.

The load generator runs on the same cores as everything it measures. Each level therefore reports
where the machine's CPU went while it ran: seconds per process (the services, Postgres, this client)
and the machine's busy time none of them used (other work on a shared machine), plus the arrivals
the generator actually made per second; and goodput per CPU-second of the platform (the services
and Postgres) against the capacity run's, which other work's share of the cores does not move. A closed-loop buyer refused for load waits 50 ms before
its next checkout (as a client honouring Retry-After would, only shorter) instead of spinning.
Per level also: the gateway's admission limit and its calls in flight (sampled from its /metrics
once a second: does the limit let in more than the platform finishes?), the p99 of this client's
own event-loop lateness (part of every latency it measures), how many GETs polled a checkout that
was not final yet, and the payments service's finalize and saga-step counts. What one refusal
costs the gateway is `make bench-refusal`'s (CPU per refusal, end to end).

4. A hot slot: BENCH_HOT_BUYERS buyers at once for one slot. One wins; every other is told at once,
   with alternatives (409) or shed by the gateway (503). Target: p99 <= 1.5 s at the gateway.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import os
import random
import re
import tempfile
import time
import urllib.request
import uuid
from typing import Iterator

from _common import Http, Result, all_cpu, bench_postgres, machine_cpu, percentile, report

import asyncpg
import jwt

from cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from cuty.codepool.v1 import codepool_pb2, codepool_pb2_grpc
from cutylib.config import DEV_JWT_SECRET, with_database
from cutylib.testing.stack import Stack
from cutylib.testing.trust import user

KINDS = os.environ.get("BENCH_KINDS", "codes,booking").split(",")
LOADS = [float(x) for x in os.environ.get("BENCH_LOADS", "1,2,3,5").split(",") if x]
SWEEP = [int(x) for x in os.environ.get("BENCH_SWEEP", "").split(",") if x]
LOAD_SECONDS = float(os.environ.get("BENCH_LOAD_SECONDS", "20"))
CAP_SECONDS = float(os.environ.get("BENCH_CAP_SECONDS", "10"))
PATIENCE = float(os.environ.get("BENCH_PATIENCE", "10"))
ONE_CALL = os.environ.get("BENCH_ONE_CALL", "0") == "1"
HOT_BUYERS = int(os.environ.get("BENCH_HOT_BUYERS", "1000"))
CLIENT_NICE = int(os.environ.get("BENCH_CLIENT_NICE", "0"))
EDGE_PRIORITY = int(os.environ.get("BENCH_EDGE_PRIORITY", "-5"))
BUYER = os.environ.get("BENCH_BUYER", "leave")
REFUSED_PAUSE = 0.05  # a closed-loop buyer's pause after a refusal
CAP_BUYERS = 16
MAX_IN_FLIGHT = 4000  # open connections at once (the client's own bound; far above any level's need)
ADMIN = user("bench-admin", "admin")
FINAL = {"COMPLETED", "FAILED", "REFUNDED", "EXPIRED", "CANCELLED", "REJECTED", "NEEDS_ATTENTION"}
ENV = {
    "CUTY_LOG_LEVEL": "WARNING", "CUTY_PSP_LOG_LEVEL": "WARNING", "CUTY_GATEWAY_ACCESS_LOG": "0",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01",
    # Every buyer is a new customer from one address (this client): the per-caller limits are not
    # what is measured here, so they are set out of the way.
    "CUTY_GATEWAY_RATE_PER_SECOND": 1_000_000, "CUTY_GATEWAY_RATE_BURST": 1_000_000,
    "CUTY_GATEWAY_ADDRESS_RATE_PER_SECOND": 1_000_000, "CUTY_GATEWAY_ADDRESS_RATE_BURST": 1_000_000,
}


class Buyers:
    """Tokens of fresh customers, made ahead so that signing them costs the measured run nothing."""

    def __init__(self, n: int):
        exp = int(time.time()) + 7200
        self.tokens = [jwt.encode({"sub": f"flash-{uuid.uuid4().hex[:12]}", "role": "customer", "exp": exp},
                                  DEV_JWT_SECRET, algorithm="HS256") for _ in range(n)]
        self.next = 0

    def take(self) -> str:
        t = self.tokens[self.next % len(self.tokens)]
        self.next += 1
        return t


class Outcome:
    def __init__(self):
        self.ok: list[float] = []        # ms, COMPLETED within patience
        self.refused: list[float] = []   # ms, visits that ended with a 429 / 503 answer
        self.refusal_ms: list[float] = []  # ms of every 429 / 503 answer (a retrying buyer's too)
        self.failed = 0                  # other answers (a declined or failed checkout)
        self.gave_up = 0                 # patience ran out
        self.arrivals = 0                # buyers started
        self.polls = 0                   # GETs of a checkout whose answer was not final yet
        self.retries = 0                 # requests a buyer sent again after a Retry-After
        self.requests = 0                # HTTP requests sent (what the load generator's CPU is spent on)
        self.refusals: dict[str, int] = {}  # each 429 / 503 answer by status, problem type and call
        self.statuses: dict[str, int] = {}
        # How each visit ended, by the call it ended at: "completed", "refused at create",
        # "refused at pay", "gave up at create|pay|poll", "error at ...".
        self.ends: dict[str, int] = {}
        self.left_ids: list[str] = []  # checkouts whose buyer left before seeing them final

    def end(self, how: str) -> None:
        self.ends[how] = self.ends.get(how, 0) + 1


async def buy(port: int, token: str, body: bytes, out: Outcome, conns: list[Http]) -> str:
    """One buyer's visit; returns how it ended (a final state, an HTTP status, or "gave-up").

    BENCH_BUYER "leave" (default): a refused buyer leaves at once. "retry": a refused buyer waits
    the answer's Retry-After and sends the same request again with the same idempotency key (as
    cuty-client does) while their patience lasts; a buyer is counted once, by how they ended."""
    out.arrivals += 1
    conn = conns.pop() if conns else Http(port)
    t0 = time.perf_counter()
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    stage, checkout_id = "create", None

    async def call(method: str, path: str, headers: dict[str, str], payload: bytes = b"") -> tuple[int, bytes]:
        for _ in range(100):  # bounded: patience ends it long before
            t = time.perf_counter()
            out.requests += 1
            status, raw = await conn.request(method, path, headers, payload)
            if status not in (429, 503):
                break
            out.refusal_ms.append((time.perf_counter() - t) * 1000)
            try:  # which refusal: the gateway's limit (overloaded), a rate limit, a service's
                kind = f"{status} {json.loads(raw).get('type', '?')} at {stage}"
            except ValueError:
                kind = f"{status} ? at {stage}"
            out.refusals[kind] = out.refusals.get(kind, 0) + 1
            wait = conn.retry_after if conn.retry_after is not None else 1.0
            if BUYER != "retry" or time.perf_counter() - t0 + wait >= PATIENCE:
                break
            out.retries += 1
            await asyncio.sleep(wait)
        return status, raw

    async def flow() -> str:
        nonlocal stage, checkout_id
        status, raw = await call("POST", "/v1/checkouts", {**auth, "Idempotency-Key": uuid.uuid4().hex}, body)
        if status != 200:
            return str(status)
        co = json.loads(raw)
        checkout_id = co["id"]
        if not ONE_CALL:
            stage = "pay"
            status, raw = await call("POST", f"/v1/checkouts/{co['id']}:pay",
                                     {**auth, "Idempotency-Key": uuid.uuid4().hex}, b'{"paymentMethod":"pm_card_ok"}')
            if status != 200:
                return str(status)
            co = json.loads(raw)
        stage = "poll"
        while (state := co["state"].removeprefix("CHECKOUT_STATE_")) not in FINAL:
            await asyncio.sleep(0.1)  # only when the inline confirm was deferred
            out.polls += 1
            status, raw = await call("GET", f"/v1/checkouts/{co['id']}", auth)
            if status != 200:
                return str(status)
            co = json.loads(raw)
        return state

    try:
        result = await asyncio.wait_for(flow(), PATIENCE)
    except asyncio.TimeoutError:
        out.gave_up += 1
        out.end(f"gave up at {stage}")
        if checkout_id:
            out.left_ids.append(checkout_id)
        conn.close()  # the tab is closed: its connection goes with it
        return "gave-up"
    except (OSError, asyncio.IncompleteReadError, ValueError):
        out.failed += 1
        out.end(f"error at {stage}")
        conn.close()
        return "error"
    ms = (time.perf_counter() - t0) * 1000
    out.statuses[result] = out.statuses.get(result, 0) + 1
    if result == "COMPLETED":
        out.ok.append(ms)
        out.end("completed")
    elif result in ("429", "503"):
        out.refused.append(ms)
        out.end(f"refused at {stage}")
        if checkout_id:  # a held checkout its buyer could not pay
            out.left_ids.append(checkout_id)
    else:
        out.failed += 1
        out.end(f"{result} at {stage}")
    conns.append(conn)
    return result


async def closed_capacity(port: int, buyers: Buyers, bodies, seconds: float, n: int = CAP_BUYERS) -> tuple[float, Outcome]:
    out, conns = Outcome(), []
    stop = time.perf_counter() + seconds

    async def worker():
        while time.perf_counter() < stop:
            if await buy(port, buyers.take(), next(bodies), out, conns) in ("429", "503"):
                await asyncio.sleep(REFUSED_PAUSE)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(n)))
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.close()
    return len(out.ok) / elapsed, out


async def open_loop(port: int, buyers: Buyers, bodies, rate: float, seconds: float) -> Outcome:
    """Poisson arrivals at `rate` per second for `seconds`; waits for every buyer to finish or leave."""
    out, conns, tasks = Outcome(), [], set()
    rng = random.Random(7)
    t0 = time.perf_counter()
    at = t0
    while True:
        at += rng.expovariate(rate)
        if at - t0 >= seconds:
            break
        if (delay := at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= MAX_IN_FLIGHT:
            out.statuses["client-bound"] = out.statuses.get("client-bound", 0) + 1
            continue
        t = asyncio.create_task(buy(port, buyers.take(), next(bodies), out, conns))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=PATIENCE + 5)
    for c in conns:
        c.close()
    return out


async def seed(stack: Stack, kind: str, n: int) -> Iterator[bytes]:
    """The buyers' request bodies: one code of one product for everyone, or a slot of their own each
    (a buyer races nobody: what is measured is load, not a hot slot)."""
    if kind == "codes":
        async with stack.channel("gateway", "codepool") as ch:
            c = codepool_pb2_grpc.CodePoolServiceStub(ch)
            p = await c.CreateProduct(codepool_pb2.CreateProductRequest(
                sku=f"FLASH-{uuid.uuid4().hex[:8]}", name="Flash sale card",
                price={"currency_code": "TRY", "amount_minor": 1000}), metadata=ADMIN)
            for start in range(0, n, 10_000):
                await c.ImportCodeBatch(codepool_pb2.ImportCodeBatchRequest(
                    product_id=p.id, batch_ref=f"b{start}",
                    codes=[f"FLASH-{uuid.uuid4().hex}" for _ in range(min(10_000, n - start))]),
                    metadata=ADMIN, timeout=300)
        return itertools.repeat(('{"productId":"%s","quantity":1}' % p.id).encode())
    async with stack.channel("gateway", "booking") as ch:
        b = booking_pb2_grpc.BookingServiceStub(ch)
        salon = await b.CreateSalon(booking_pb2.CreateSalonRequest(name="Flash", time_zone="Europe/Istanbul"),
                                    metadata=ADMIN)
        base = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)
        slots: list[str] = []
        per_resource = 2000
        for r in range((n + per_resource - 1) // per_resource):
            res = await b.CreateResource(booking_pb2.CreateResourceRequest(salon_id=salon.id, name=f"Chair {r}"),
                                         metadata=ADMIN)
            for start in range(0, min(per_resource, n - r * per_resource), 500):
                req = booking_pb2.BatchCreateSlotsRequest(salon_id=salon.id)
                for h in range(start, min(start + 500, per_resource, n - r * per_resource)):
                    s = req.slots.add(resource_id=res.id)
                    s.start_time.FromDatetime(base + dt.timedelta(hours=h))
                    s.end_time.FromDatetime(base + dt.timedelta(hours=h + 1))
                    s.price.currency_code, s.price.amount_minor = "TRY", 75000
                out = await b.BatchCreateSlots(req, metadata=ADMIN, timeout=60)
                slots += [s.id for s in out.slots]
    return iter([('{"slotId":"%s"}' % slot).encode() for slot in slots])


async def hot_slot(stack: Stack, buyers: Buyers, n: int) -> Result:
    """`n` buyers at once for one slot: one winner, every other told at once (409 with alternatives,
    or 503 when the gateway sheds them); p50/p99 of all answers."""
    async with stack.channel("gateway", "booking") as ch:
        b = booking_pb2_grpc.BookingServiceStub(ch)
        salon = await b.CreateSalon(booking_pb2.CreateSalonRequest(name="Saturday", time_zone="Europe/Istanbul"),
                                    metadata=ADMIN)
        start = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=3)
        req = booking_pb2.BatchCreateSlotsRequest(salon_id=salon.id)
        for r in range(3):
            res = await b.CreateResource(booking_pb2.CreateResourceRequest(salon_id=salon.id, name=f"Chair {r}"),
                                         metadata=ADMIN)
            for h in range(4):
                s = req.slots.add(resource_id=res.id)
                s.start_time.FromDatetime(start + dt.timedelta(hours=h))
                s.end_time.FromDatetime(start + dt.timedelta(hours=h + 1))
                s.price.currency_code, s.price.amount_minor = "TRY", 75000
        hot = (await b.BatchCreateSlots(req, metadata=ADMIN)).slots[0].id
    body = ('{"slotId":"%s"}' % hot).encode()
    conns = [Http(stack.http_port) for _ in range(n)]
    for c in conns:  # connected up front: the rush is the requests, not the handshakes
        c.reader, c.writer = await asyncio.open_connection("127.0.0.1", stack.http_port)
    tokens = [buyers.take() for _ in range(n)]
    gate = asyncio.Event()
    answers: list[tuple[int, float, bool]] = []

    async def one(i: int) -> None:
        await gate.wait()
        t0 = time.perf_counter()
        status, raw = await conns[i].request("POST", "/v1/checkouts", {
            "Authorization": f"Bearer {tokens[i]}", "Idempotency-Key": uuid.uuid4().hex,
            "Content-Type": "application/json"}, body)
        offered = status == 409 and bool(json.loads(raw).get("alternatives"))
        answers.append((status, (time.perf_counter() - t0) * 1000, offered))

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(0.2)
    t0 = time.perf_counter()
    gate.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.close()
    lat = sorted(ms for _, ms, _ in answers)
    by_status: dict[str, int] = {}
    for status, _, _ in answers:
        by_status[str(status)] = by_status.get(str(status), 0) + 1
    r = Result(f"hot slot: {n} buyers at once", n, round(n / elapsed, 1), round(percentile(lat, 0.5), 1),
               round(percentile(lat, 0.99), 1), round(lat[-1], 1))
    r.extra = {"answers": by_status, "losers_with_alternatives": sum(1 for *_, o in answers if o)}
    r.notes = (f"{by_status.get('200', 0)} winner(s); {r.extra['losers_with_alternatives']} told with alternatives; "
               f"{by_status.get('503', 0)} shed")
    return r


async def settle(stack: Stack, left: list[Result] | None = None, timeout: float = 180) -> dict:
    """Waits until no checkout is left in a state where money may still move, then compares the
    money. A HELD checkout (its buyer never paid: refused, or gone) moves no money; it ends EXPIRED
    at its hold's expiry, minutes later, and is counted, not waited for."""
    dsn = with_database(stack.pg_dsn, "cuty_payments")
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout
        while True:
            open_ = await conn.fetchval("SELECT count(*) FROM checkouts WHERE state <> ALL($1::text[])",
                                        [*FINAL, "HELD"])
            if open_ == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        completed, kept = await conn.fetchrow(
            "SELECT count(*), coalesce(sum(amount_minor), 0) FROM checkouts WHERE state = 'COMPLETED'")
        by_state = dict(await conn.fetch("SELECT state, count(*) FROM checkouts GROUP BY state"))
        for r in left or ():
            # What became of the checkouts whose buyers left (gave up, or were refused at pay):
            # COMPLETED = sold after the buyer had gone (charged; a buyer who tries again pays
            # twice); HELD = never paid, its codes or slot locked until the hold expires.
            r.extra["left_checkouts"] = dict(await conn.fetch(
                "SELECT state, count(*) FROM checkouts WHERE id = ANY($1::uuid[]) GROUP BY state", r.extra.pop("_left")))
    finally:
        await conn.close()
    ledger = await stack.psp_ledger()
    psp_kept = sum(c["amount"] - c.get("amount_refunded", 0) for c in ledger["charges"])
    return {"unsettled": open_, "completed": completed, "platform_kept_minor": int(kept),
            "psp_kept_minor": int(psp_kept), "money_exact": int(kept) == int(psp_kept), "by_state": by_state}


class LimitWatch:
    """The gateway's admission limit and its calls in flight, sampled from its /metrics every
    SAMPLE_SECONDS while a level runs (a scrape costs the gateway what Prometheus' would):
    whether the limit let in more than the platform finishes."""
    SAMPLE_SECONDS = 1.0

    def __init__(self, stack: Stack):
        self.url = f"http://127.0.0.1:{stack.metrics_ports['gateway']}/metrics"
        self.samples: list[tuple[float, float]] = []
        self.task = asyncio.create_task(self._run())

    def _scrape(self) -> tuple[float, float] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        found = dict(re.findall(r"^(cuty_gateway_concurrency_limit|cuty_gateway_calls_in_flight) ([0-9.e+]+)$",
                                text, re.M))
        if len(found) < 2:
            return None
        return float(found["cuty_gateway_concurrency_limit"]), float(found["cuty_gateway_calls_in_flight"])

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.SAMPLE_SECONDS)
            got = await asyncio.to_thread(self._scrape)
            if got:
                self.samples.append(got)

    def report(self) -> dict:
        self.task.cancel()
        if not self.samples:
            return {}
        limits, flying = sorted(s[0] for s in self.samples), sorted(s[1] for s in self.samples)
        return {"limit_p50": limits[len(limits) // 2], "limit_min": limits[0], "limit_max": limits[-1],
                "in_flight_p50": flying[len(flying) // 2], "in_flight_max": flying[-1]}


class PaymentsCounters:
    """How the payments service's finalizes went during a level (its /metrics before and after):
    which path (sync answer, webhook, worker) applied a payment's outcome and which found it done,
    version conflicts, deferred finalizes and saga step counts. A checkout whose outcome is applied
    by one path and then seen again by another costs more than one that is not."""
    NAMES = ("cuty_payments_finalize_total", "cuty_payments_version_conflicts_total",
             "cuty_payments_deferred_finalizes_total", "cuty_checkout_step_duration_seconds_count",
             "cuty_checkout_retries_total")

    def __init__(self, stack: Stack):
        self.url = f"http://127.0.0.1:{stack.metrics_ports['payments-0']}/metrics"
        self.before = self._scrape()

    def _scrape(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith(self.NAMES):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def report(self) -> dict[str, float]:
        after = self._scrape()
        return {k: v - self.before.get(k, 0.0) for k, v in sorted(after.items()) if v - self.before.get(k, 0.0)}


class LoopLag:
    """How late this process's event loop wakes a 10 ms sleep while a level runs: a refusal's
    latency as the client measures it includes this lag, which is the load generator's own, not
    the gateway's."""

    def __init__(self):
        self.late: list[float] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            self.late.append((time.perf_counter() - t0 - 0.01) * 1000)

    def report(self) -> float:
        self.task.cancel()
        return round(percentile(sorted(self.late), 0.99), 1)


class CpuWatch:
    """Where the machine's CPU went during one measured level (see the module's docstring)."""

    def __init__(self, stack: Stack, pg):
        self.stack, self.pg = stack, pg
        self.ours0, self.machine0, self.t0 = all_cpu(stack, pg), machine_cpu(), time.perf_counter()

    def report(self) -> dict:
        ours = {n: s - self.ours0.get(n, 0.0) for n, s in all_cpu(self.stack, self.pg).items()}
        busy, total = (b - a for a, b in zip(self.machine0, machine_cpu()))
        wall = time.perf_counter() - self.t0
        cores = total / wall if wall > 0 else float(os.cpu_count() or 1)
        used = sum(ours.values())
        return {"cores": round(cores, 1), "machine_busy_share": round(busy / total, 2) if total else None,
                "client_share": round(ours["client"] / total, 2) if total else None,
                "services_and_postgres_share": round((used - ours["client"]) / total, 2) if total else None,
                "other_work_share": round(max(0.0, busy - used) / total, 2) if total else None,
                "cpu_s": {n: round(v, 1) for n, v in sorted(ours.items())}}


def per_cpu(out: Outcome, cpu: dict | None) -> float | None:
    """Checkouts completed within patience per CPU-second of the platform (the services and
    Postgres, not the load generator): the goodput on a shared machine, whatever share of the
    cores other work took during the level."""
    if not cpu:
        return None
    used = sum(v for n, v in cpu["cpu_s"].items() if n != "client")
    return len(out.ok) / used if used > 0 else None


def row(kind: str, label: str, out: Outcome, seconds: float, capacity: float, offered: float | None,
        cpu: dict | None = None, capacity_per_cpu: float | None = None) -> Result:
    ok, refused = sorted(out.ok), sorted(out.refusal_ms)
    goodput = len(ok) / seconds
    r = Result(f"{kind} {label}", CAP_BUYERS if offered is None else 0, round(goodput, 1),
               round(percentile(ok, 0.5), 1), round(percentile(ok, 0.99), 1), round(ok[-1] if ok else 0.0, 1),
               limit_ops_per_s=round(capacity, 1), ratio_to_limit=round(goodput / capacity, 3) if capacity else None)
    r.extra = {"offered_per_s": round(offered, 1) if offered else None,
               "arrivals_per_s": round(out.arrivals / seconds, 1), "completed": len(ok),
               "refused": len(refused), "refusal_p99_ms": round(percentile(refused, 0.99), 1),
               "gave_up": out.gave_up, "failed": out.failed, "polls": out.polls, "answers": out.statuses,
               "visits_ended": dict(sorted(out.ends.items())), "refusals": dict(sorted(out.refusals.items())), "buyer": BUYER, "retries": out.retries, "cpu": cpu}
    if cpu and out.requests:
        # The load generator's own cost: it shares the cores with what it measures.
        r.extra["client_cpu_us_per_request"] = round(1e6 * cpu["cpu_s"]["client"] / out.requests)
    r.extra["requests"] = out.requests
    efficiency = per_cpu(out, cpu)
    if efficiency is not None:
        r.extra["checkouts_per_platform_cpu_s"] = round(efficiency, 2)
        if capacity_per_cpu:
            r.extra["per_cpu_vs_capacity"] = round(efficiency / capacity_per_cpu, 3)
    ends = ", ".join(f"{k} {v}" for k, v in sorted(out.ends.items()))
    r.notes = (f"goodput {r.ratio_to_limit:.2f} of capacity; {out.arrivals} buyers: {ends}; refusal p99 "
               f"{r.extra['refusal_p99_ms']} ms" if offered else f"capacity (closed loop); {ends}")
    if cpu:
        r.notes += (f"; per platform CPU-s {r.extra.get('per_cpu_vs_capacity', 1.0):.2f} of capacity's; "
                    f"other work took {cpu['other_work_share']:.0%} of the machine")
    return r


async def main() -> None:
    pg = bench_postgres()
    work = tempfile.mkdtemp(prefix="cuty-bench-overload-")
    stack = Stack(pg.dsn, work, gateway=True, env=ENV)
    print("starting postgres, the services, the PSP simulator and the gateway ...", flush=True)
    await stack.start()
    if CLIENT_NICE:
        os.nice(CLIENT_NICE)  # this process only: the services were started at our old priority
    if EDGE_PRIORITY:
        # The gateway's CPU reserved, as a deployment reserves the edge's (its pod's CPU request
        # weighs its share of a node's cores): on two shared cores with equal weights its event loop
        # otherwise waits its turn behind seven busy processes, and so does every refusal.
        try:
            os.setpriority(os.PRIO_PROCESS, stack.procs["gateway"].proc.pid, EDGE_PRIORITY)
        except PermissionError:
            print(f"BENCH_EDGE_PRIORITY={EDGE_PRIORITY} needs root (CAP_SYS_NICE): the gateway runs at "
                  "the others' priority", flush=True)
    results: list[Result] = []
    try:
        for kind in KINDS:
            # Enough for the capacity run and every level at 6x a generous capacity guess.
            need = int(80 * (CAP_SECONDS + LOAD_SECONDS * sum(LOADS) * 1.3)) + 2000
            print(f"{kind}: seeding {need} {'codes' if kind == 'codes' else 'slots'} ...", flush=True)
            bodies = await seed(stack, kind, need)
            buyers = Buyers(int(need * 1.1))
            await closed_capacity(stack.http_port, buyers, bodies, 3)  # warm up
            watch, limits, counters = CpuWatch(stack, pg), LimitWatch(stack), PaymentsCounters(stack)
            capacity, cap_out = await closed_capacity(stack.http_port, buyers, bodies, CAP_SECONDS)
            print(f"{kind}: capacity {capacity:.1f} checkouts/s", flush=True)
            cap_cpu = watch.report()
            capacity_per_cpu = per_cpu(cap_out, cap_cpu)
            results.append(row(kind, "capacity", cap_out, CAP_SECONDS, capacity, None, cap_cpu))
            results[-1].extra["admission"] = limits.report()
            results[-1].extra["payments"] = counters.report()
            for n in SWEEP:
                watch, limits = CpuWatch(stack, pg), LimitWatch(stack)
                rate, out = await closed_capacity(stack.http_port, buyers, bodies, CAP_SECONDS, n)
                print(f"{kind}: {n} closed-loop buyers: {rate:.1f} checkouts/s", flush=True)
                results.append(row(kind, f"{n} closed-loop buyers", out, CAP_SECONDS, capacity, None, watch.report()))
                results[-1].concurrency = n
                results[-1].extra["admission"] = limits.report()
            for x in LOADS:
                rate = capacity * x
                print(f"{kind}: {x:g}x = {rate:.0f} arrivals/s for {LOAD_SECONDS:g} s ...", flush=True)
                watch, limits, lag = CpuWatch(stack, pg), LimitWatch(stack), LoopLag()
                counters = PaymentsCounters(stack)
                out = await open_loop(stack.http_port, buyers, bodies, rate, LOAD_SECONDS)
                results.append(row(kind, f"{x:g}x offered", out, LOAD_SECONDS, capacity, rate, watch.report(),
                                   capacity_per_cpu))
                results[-1].extra["admission"] = limits.report()
                results[-1].extra["client_loop_lag_p99_ms"] = lag.report()
                results[-1].extra["payments"] = counters.report()
                results[-1].extra["_left"] = out.left_ids
                await asyncio.sleep(2)  # the backlog of the level before drains
        if HOT_BUYERS:
            print(f"hot slot: {HOT_BUYERS} buyers at once ...", flush=True)
            results.append(await hot_slot(stack, Buyers(HOT_BUYERS), HOT_BUYERS))
        money = await settle(stack, [r for r in results if "_left" in r.extra])
        print(f"settled: {money}", flush=True)
        results.append(Result("money after settling", 0, 0, 0, 0, 0,
                              notes="exact" if money["money_exact"] else "MISMATCH", extra=money))
    finally:
        await stack.stop()
        pg.close()
    report("overload", results)


if __name__ == "__main__":
    asyncio.run(main())
