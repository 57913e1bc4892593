"""What isolating merchants costs a checkout (`make bench-isolation`): the services' own database roles
(Row-Level Security applies, fail closed) and the webhook delivery workers in a process of their own,
against the services connecting as the owner (a superuser: no RLS) with the workers inside payments.

Two whole stacks on one PostgreSQL, the same catalogue, alternated in BENCH_ROUNDS rounds so the
machine's drift hits both; each has one merchant webhook endpoint subscribed to every event, answered
by a local receiver in this process, so deliveries run as they would in production:

- before: CUTY_TEST_DB_ROLE=owner, payments runs the delivery workers (CUTY_WEBHOOKS_OUT_WORKERS=1);
- after: the services as their roles, payments delivers nothing (CUTY_WEBHOOKS_OUT_WORKERS=0) and
  `python -m payments webhooks-out` delivers, connected as `payments_webhooks_out`.

One op = a slot purchase (CreateCheckout, then PayCheckout) until COMPLETED, over mutual TLS, at
BENCH_CONCURRENCY (16). Printed: throughput, p50/p99, CPU per checkout of every process (the
delivery process included) and after/before; the limit column is the before side (ratio < 1: the
isolation costs). BENCH_SECONDS (default 48) is each side's total time, after a warm-up of
BENCH_WARMUP_SECONDS (5) per side that is not counted.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time

from _common import Run, bench_postgres, cpu_seconds, merged, percentile, report

import asyncpg
from aiohttp import web

from checkout import ENV, Side, buyer, measure, per_checkout
from cutylib.config import WEBHOOKS_OUT_DB_ROLE, with_user
from cutylib.pgcluster import free_port
from cutylib.principal import Principal
from cutylib.testing.procs import REPO, wait_for
from cutylib.testing.trust import TEST_MERCHANT
from payments.outbound.repository import Endpoints
from payments.outbound.secrets import SecretBox
from payments.outbound.service import WebhookEndpoints

SECONDS = float(os.environ.get("BENCH_SECONDS", "48"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "6"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
WARMUP = float(os.environ.get("BENCH_WARMUP_SECONDS", "5"))
# BENCH_SIDES="before,roles,after": also the service roles alone, the delivery workers still in payments.
SIDES = os.environ.get("BENCH_SIDES", "before,after").split(",")
EVENTS = ["checkout.completed", "booking.confirmed"]


class Receiver:
    """A merchant's endpoint: reads the body, answers 204."""

    def __init__(self) -> None:
        self.count = 0

    async def start(self) -> str:
        async def hook(request: web.Request) -> web.Response:
            await request.read()
            self.count += 1
            return web.Response(status=204)
        app = web.Application()
        app.router.add_post("/hook", hook)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}/hook"


class Isolated(Side):
    """A checkout stack as `before` or `after` (module docstring)."""

    def __init__(self, server, work: str, name: str):
        super().__init__(server, work, secure=True)
        self.name = name
        self.stack.workdir = self.stack.workdir.with_name(name)
        self.out: subprocess.Popen | None = None
        if name == "before":
            self.stack.env.update(CUTY_TEST_DB_ROLE="owner", CUTY_WEBHOOKS_OUT_WORKERS="1")
        elif name == "roles":
            self.stack.env.update(CUTY_WEBHOOKS_OUT_WORKERS="1")
        else:
            self.stack.env.update(CUTY_WEBHOOKS_OUT_WORKERS="0")

    async def start(self, n_slots: int, n_products: int) -> "Isolated":
        await super().start(n_slots, n_products)
        if self.name == "after":
            health = free_port()
            env = {**self.stack.common_env(), "CUTY_WEBHOOKS_OUT_WORKERS": "1",
                   "CUTY_WEBHOOKS_OUT_HEALTH_PORT": str(health), "CUTY_WEBHOOKS_OUT_METRICS_PORT": "0",
                   "CUTY_WEBHOOKS_OUT_DATABASE_URL": with_user(self.dbs["payments"], WEBHOOKS_OUT_DB_ROLE)}
            log = open(self.stack.workdir / "logs" / "webhooks-out.log", "ab")
            self.out = subprocess.Popen([sys.executable, "-m", "payments", "webhooks-out"], env=env, cwd=str(REPO),
                                        stdout=log, stderr=subprocess.STDOUT)
            log.close()
            from grpc_health.v1 import health_pb2, health_pb2_grpc
            import grpc

            async def serving() -> bool:
                try:
                    async with grpc.aio.insecure_channel(f"127.0.0.1:{health}") as ch:
                        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                        return r.status == health_pb2.HealthCheckResponse.SERVING
                except grpc.aio.AioRpcError:
                    return False
            await wait_for(serving, timeout=60, message="webhooks-out serving")
        return self

    async def subscribe(self, url: str) -> None:
        pool = await asyncpg.create_pool(self.dbs["payments"], min_size=1, max_size=2)
        try:
            box = SecretBox.load(os.environ.get("CUTY_WEBHOOK_SECRET_KEYS", ""), str(self.stack.workdir / "data"))
            endpoints = WebhookEndpoints(Endpoints(pool, box), "development", allow_private=True)
            await endpoints.create(Principal("bench-admin", "admin", TEST_MERCHANT), url, EVENTS)
        finally:
            await pool.close()

    def cpu(self, server) -> dict[str, float]:
        return {"webhooks-out": cpu_seconds(self.out.pid)} if self.out is not None else {}

    async def stop(self) -> None:
        if self.out is not None and self.out.poll() is None:
            self.out.terminate()
            self.out.wait(10)
        await super().stop()


async def main() -> None:
    server = bench_postgres()
    work = tempfile.mkdtemp(prefix="cuty-bench-isolation-")
    sides = [Isolated(server, work, name) for name in SIDES]
    receiver = Receiver()
    url = await receiver.start()
    try:
        t0 = time.perf_counter()
        n_slots = int((SECONDS + WARMUP) * 250) + 500  # more than the fastest side buys
        for side in sides:
            await side.start(n_slots, 1)
            await side.subscribe(url)
        print(f"catalogue: {n_slots} slots per stack in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        for side in sides:  # warm-up, not counted: pools, prepared statements, the first deliveries
            await measure(side, server, buyer("booking", "two-call", side, side.products[0], []), CONCURRENCY, WARMUP)
        measured = {s.name: [] for s in sides}
        cpu_of = {s.name: {} for s in sides}
        for rnd in range(ROUNDS):
            for side in (sides[rnd % len(sides):] + sides[:rnd % len(sides)]):  # each side first in turn
                extra0 = side.cpu(server)
                run, cpu = await measure(side, server, buyer("booking", "two-call", side, side.products[0], []),
                                         CONCURRENCY, SECONDS / ROUNDS)
                for n, v in side.cpu(server).items():
                    cpu[n] = v - extra0[n]
                measured[side.name].append(run)
                for n, v in cpu.items():
                    cpu_of[side.name][n] = cpu_of[side.name].get(n, 0.0) + v
                print(f"  round {rnd} {side.name:6} {run.ops / run.seconds:7.1f}/s", file=sys.stderr)
        await asyncio.sleep(2)  # the last deliveries
        before = merged(measured["before"])
        per = {name: per_checkout(cpu_of[name], merged(measured[name]).ops) for name in measured}
        label = {"before": "owner role, delivery in payments (before)",
                 "roles": "service roles, delivery in payments",
                 "after": "service roles, delivery process apart (after)"}
        results = [merged(measured[name]).result(
            f"booking two-call->COMPLETED, {label[name]}", CONCURRENCY, cpu_ms_per_checkout=per[name],
            **({} if name == "before" else {"limit": before,
                                            "notes": "limit: the before side, alternated with it; ratio < 1 is the cost"}))
            for name in SIDES]
        report("isolation", results)
        for name in SIDES:
            run = merged(measured[name])
            lat = sorted(run.latencies_ms)
            print(f"  {name:6} {run.ops_per_s:7.1f}/s p50 {percentile(lat, 0.5):6.1f} ms p99 {percentile(lat, 0.99):6.1f} ms "
                  f"cpu/checkout {per[name]['total']:.2f} ms {per[name]}")
            if name != "before":
                print(f"  {name}/before: throughput {run.ops_per_s / before.ops_per_s:.3f}, "
                      f"CPU per checkout {per[name]['total'] / per['before']['total']:.3f}")
        print(f"  webhooks delivered {receiver.count}")
    finally:
        await receiver.runner.cleanup()
        for side in sides:
            await side.stop()
        server.close()


if __name__ == "__main__":
    asyncio.run(main())
