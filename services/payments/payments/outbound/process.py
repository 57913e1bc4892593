"""`python -m payments webhooks-out`: the merchants' webhook delivery workers alone, without the
payments gRPC API (docs/webhooks-out.md, "A process of its own").

Why apart from the orchestrator: the URL a delivery goes to is a merchant admin's choice, so what
answers is untrusted. The worker reads little of any answer (worker.py), and in its own process
whatever an endpoint still manages (slowness, a library bug, a resource it exhausts) costs
deliveries, never checkouts. The process holds the least it needs: its database and the keyring of
the endpoint secrets; no certificate (it calls no service and serves no RPC, so it cannot reach
booking or the code pool), no PSP secret. It never migrates: it waits until the payments migrations
are applied, as a replica started with CUTY_MIGRATE_ON_START=false does.

Health is gRPC health in plaintext on CUTY_WEBHOOKS_OUT_HEALTH_PORT (51054): "liveness" while the
process runs, "" (readiness) while its database answers, as for the services. Metrics (deliveries by
outcome and error class, open circuits, backlog, the oldest due delivery's wait; outbound/metrics.py)
on CUTY_WEBHOOKS_OUT_METRICS_PORT (9468).
"""
from __future__ import annotations

import asyncio
import logging
import pathlib
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cutylib.config import (WEBHOOKS_OUT_HEALTH_PORT as HEALTH_PORT, WEBHOOKS_OUT_METRICS_PORT as METRICS_PORT,
                            Settings, env_int, env_str, webhooks_out_database_url)
from cutylib.db import ALL_MERCHANTS, create_pool
from cutylib.dbwatch import DatabaseWatch
from cutylib.grpc_server import LIVENESS, _supervised as supervised
from cutylib.metrics import metrics_enabled, start_metrics_server

from ..settings import new_worker_id
from .secrets import SecretBox
from .wiring import delivery_worker_id, refresh_delivery_gauges
from .worker import DeliveryOptions, DeliveryWorker

log = logging.getLogger(__name__)

NAME = "payments-webhooks-out"


class WebhooksOut:
    """Health, the database watch and `options.workers` delivery workers, until `stop()`."""

    def __init__(self, pool, dsn: str, migrations: pathlib.Path | None, box: SecretBox, *,
                 host: str = "0.0.0.0", health_port: int = HEALTH_PORT, options: DeliveryOptions | None = None):
        self.pool = pool
        self.options = options or DeliveryOptions()
        if self.options.workers < 1:
            raise SystemExit("CUTY_WEBHOOKS_OUT_WORKERS must be at least 1 in the webhooks-out process")
        self.egress = self.options.egress()  # production refuses CUTY_WEBHOOK_ALLOW_PRIVATE: before serving
        self.box = box
        self.health = health.aio.HealthServicer()
        self.health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
        self.health_port = self.health_server.add_insecure_port(f"{host}:{health_port}")
        self.watch = DatabaseWatch(pool, dsn, migrations, migrate_on_start=False)
        self.watch.set_serving = self._set_serving
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()

    async def _set_serving(self, serving: bool) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING if serving
                              else health_pb2.HealthCheckResponse.NOT_SERVING)

    async def run(self) -> None:
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self._set_serving(False)
        await self.health_server.start()
        watch = asyncio.create_task(self.watch.run(), name=f"{NAME}:database-watch")
        ready = asyncio.create_task(self.watch.ready.wait())
        stopped = asyncio.create_task(self._stopped.wait())
        try:
            await asyncio.wait([ready, stopped, watch], return_when=asyncio.FIRST_COMPLETED)
            if self.watch.ready.is_set() and not self._stopped.is_set():
                me = new_worker_id()
                self._tasks = [asyncio.create_task(supervised(
                    DeliveryWorker(self.pool, delivery_worker_id(me, i), self.options, box=self.box,
                                   egress=self.egress).run),
                    name=f"{NAME}:worker-{i}") for i in range(self.options.workers)]
                refresh_delivery_gauges(
                    lambda run: self._tasks.append(asyncio.create_task(supervised(run), name=f"{NAME}:gauges")),
                    self.pool, self.box)
                log.info("webhook delivery workers started", extra={"workers": self.options.workers,
                                                                    "health_port": self.health_port})
                await asyncio.wait([stopped, watch], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (ready, stopped, watch, *self._tasks):
                t.cancel()
            await asyncio.gather(ready, stopped, watch, *self._tasks, return_exceptions=True)
            await self.health.enter_graceful_shutdown()
            await self.health_server.stop(0)

    def stop(self) -> None:
        self._stopped.set()


async def serve(migrations: pathlib.Path) -> None:
    settings = Settings.from_env()
    settings.check_secrets(NAME)
    # Its own database role (payments_webhooks_out: the delivery tables only; docs/security.md).
    dsn = webhooks_out_database_url()
    # Connected on demand: the database may be away at start (the watch says when it is back).
    pool = await create_pool(dsn, min_size=0, max_size=settings.db_pool_max, application_name=f"cuty-{NAME}",
                             acquire_timeout=settings.db_acquire_timeout_seconds, merchant=ALL_MERCHANTS)
    try:
        process = WebhooksOut(pool, dsn, migrations, SecretBox.load(settings.webhook_secret_keys, settings.data_dir),
                              host=env_str("CUTY_WEBHOOKS_OUT_HOST", "0.0.0.0"),
                              health_port=env_int("CUTY_WEBHOOKS_OUT_HEALTH_PORT", HEALTH_PORT))
        if metrics_enabled():
            start_metrics_server(NAME, env_int("CUTY_WEBHOOKS_OUT_METRICS_PORT", METRICS_PORT))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, process.stop)
        await process.run()
    finally:
        await pool.close()


def main(migrations: pathlib.Path) -> None:
    from cutylib.service import event_loop_factory
    from cutylib.telemetry import init_telemetry

    init_telemetry(NAME, instrument_grpc=False)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(migrations))
