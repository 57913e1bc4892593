"""`python -m payments webhooks-out`, a real process: with CUTY_WEBHOOKS_OUT_WORKERS=0 the payments
process delivers nothing; the separate process delivers (signed), answers health, survives an
endpoint answering a 1 GiB gzip bomb and an endless body with its memory flat, and stops on
SIGTERM."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import uuid

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cutylib.config import WEBHOOKS_OUT_DB_ROLE, with_user
from cutylib.pgcluster import free_port
from cutylib.principal import Principal
from cutylib.testing.procs import REPO, wait_for
from cutylib.testing.stack import Stack
from payments import signature
from payments.outbound.repository import Endpoints
from payments.outbound.secrets import SecretBox
from payments.outbound.service import WebhookEndpoints

from hostile_endpoint import HostileEndpoint
from webhook_receiver import Receiver

MERCHANT = "merchant-webhooks-out-" + uuid.uuid4().hex[:6]
ADMIN = Principal("admin-wo", "admin", MERCHANT)
KEYS = f"w1:{base64.b64encode(os.urandom(32)).decode()};active=w1"


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


async def publish(db: asyncpg.Pool, endpoint_ids: list[str]) -> str:
    """An event and its deliveries, as the outbox trigger writes them."""
    event = uuid.uuid4()
    await db.execute("INSERT INTO merchant_events (merchant_id, id, type, payload) "
                     "VALUES ($1, $2, 'checkout.completed', $3::jsonb)",
                     MERCHANT, event, json.dumps({"id": str(event), "type": "checkout.completed", "merchant_id": MERCHANT,
                                                  "data": {"checkout": {"id": str(uuid.uuid4())}}}))
    for ep in endpoint_ids:
        await db.execute("INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, next_attempt_at, give_up_at) "
                         "VALUES ($1, $2, $3, clock_timestamp(), clock_timestamp() + interval '3 days')",
                         MERCHANT, uuid.UUID(ep), event)
    await db.execute("NOTIFY cuty_merchant_events")
    return str(event)


async def healthy(port: int, service: str = "") -> bool:
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
            return r.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.aio.AioRpcError:
        return False


async def test_the_webhooks_out_process_delivers_alone_and_keeps_its_memory(pg, payments_dsn, tmp_path):
    stack = Stack(pg.dsn, tmp_path, services=("payments",),
                  env={"CUTY_WEBHOOK_SECRET_KEYS": KEYS, "CUTY_WEBHOOKS_OUT_WORKERS": 0,
                       "CUTY_WEBHOOK_RETRY_BASE_SECONDS": 0.05, "CUTY_WEBHOOK_RETRY_CAP_SECONDS": 0.2,
                       "CUTY_WEBHOOK_TIMEOUT_SECONDS": 2})
    await stack.start()
    db = await asyncpg.create_pool(payments_dsn, min_size=1, max_size=4)
    out = None
    try:
        endpoints = WebhookEndpoints(Endpoints(db, SecretBox.load(KEYS, str(tmp_path))), "development",
                                     allow_private=True)
        async with Receiver() as rx, HostileEndpoint() as bad:
            good = await endpoints.create(ADMIN, rx.url, ["checkout.completed"])
            rx.secrets.append(good.secret)
            hostile = [await endpoints.create(ADMIN, bad.url(mode, 200), ["checkout.completed"])
                       for mode in ("bomb", "endless")]
            first = await publish(db, [good.id])
            # The payments process runs no delivery worker: the delivery stays untouched (a second
            # and a half is many polls of a worker that would be there).
            await asyncio.sleep(1.5)
            assert dict(await db.fetchrow("SELECT state, attempts FROM webhook_deliveries WHERE merchant_id = $1",
                                          MERCHANT)) == {"state": "pending", "attempts": 0}

            health_port, metrics_port = free_port(), free_port()
            # It connects as its own role: the delivery tables only (docs/security.md, "Database roles").
            env = {**stack.common_env(), "CUTY_WEBHOOKS_OUT_WORKERS": "1",
                   "CUTY_WEBHOOKS_OUT_DATABASE_URL": with_user(payments_dsn, WEBHOOKS_OUT_DB_ROLE),
                   "CUTY_WEBHOOKS_OUT_HEALTH_PORT": str(health_port),
                   "CUTY_WEBHOOKS_OUT_METRICS_PORT": str(metrics_port)}
            log = open(tmp_path / "webhooks-out.log", "ab")
            out = subprocess.Popen([sys.executable, "-m", "payments", "webhooks-out"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=str(REPO))
            log.close()
            await wait_for(lambda: healthy(health_port), timeout=30, message="webhooks-out ready")
            assert await healthy(health_port, "liveness")
            await rx.until(lambda evs: first in evs, timeout=20)
            assert {r["usename"] for r in await db.fetch(
                "SELECT usename FROM pg_stat_activity WHERE application_name = 'cuty-payments-webhooks-out'")} \
                == {WEBHOOKS_OUT_DB_ROLE}
            before = rss_of(out.pid)
            peak = before
            await publish(db, [h.id for h in hostile] + [good.id])

            async def all_answered():
                nonlocal peak
                peak = max(peak, rss_of(out.pid))
                return await db.fetchval("SELECT count(*) FROM webhook_deliveries WHERE merchant_id = $1 "
                                         "AND state = 'delivered'", MERCHANT) == 4
            await wait_for(all_answered, timeout=30, interval=0.01, message="every delivery answered")
            peak = max(peak, rss_of(out.pid))
        # Its own metrics: attempts by outcome and error class, and the gauges read from the database.
        import urllib.request
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        assert 'cuty_payments_webhook_deliveries_total{error="",outcome="delivered"} 4.0' in scraped, scraped
        for name in ("cuty_payments_webhook_backlog", "cuty_payments_webhook_oldest_due_age_seconds",
                     "cuty_payments_webhook_circuits_open", "cuty_payments_webhook_in_flight"):
            assert f"\n{name} " in scraped, name
        print(f"webhooks-out RSS {before / 2**20:.0f} MiB before the hostile answers, peak {peak / 2**20:.0f} MiB")
        assert peak - before < 50 * 2**20
        assert len(rx.events) == 2 and rx.rejected == 0
        for r in rx.requests:
            signature.verify(r["headers"]["cuty-signature"], r["body"], [good.secret])
        workers = {w for (w,) in await db.fetch(
            "SELECT DISTINCT a.worker FROM webhook_attempts a WHERE a.merchant_id = $1", MERCHANT)}
        assert workers and all(w.split(":")[2] == str(out.pid) for w in workers), workers  # webhooks:<host>:<pid>:…
        out.send_signal(signal.SIGTERM)
        assert out.wait(10) == 0
    finally:
        if out is not None and out.poll() is None:
            out.kill()
            out.wait(5)
        await db.execute("DELETE FROM webhook_endpoints WHERE merchant_id = $1", MERCHANT)
        await db.close()
        await stack.stop()
