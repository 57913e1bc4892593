"""One merchant cannot stall every merchant's webhooks, and webhook URLs cannot reach inside.

Real workers (their own pool, as the `payments-webhooks-out` process has), real HTTP endpoints
(tests/webhook_receiver.py, tests/hostile_endpoint.py), the real claim: a merchant whose 16 endpoints
hang, with a redeliver storm, holds no more than its share while another merchant's events arrive;
an endpoint's circuit opens, probes alone and closes; a URL that resolves to a private address is
refused when connecting, logged as `forbidden_address`."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import uuid

import aiohttp
import pytest
import pytest_asyncio

from cutylib import errors
from cutylib.config import with_database
from cutylib.db import create_pool
from cutylib.principal import Principal
from cutylib.testing.procs import wait_for
from payments.outbound.egress import Egress, connector
from payments.outbound.metrics import DELIVERIES, OutboundMetrics, RedeliveryMetrics
from payments.outbound.repository import Endpoints
from payments.outbound.service import WebhookEndpoints
from payments.outbound.worker import DeliveryWorker

from hostile_endpoint import HostileEndpoint
from outbound_testkit import FAST
from webhook_receiver import Receiver

pytestmark = pytest.mark.usefixtures("clean_endpoints")


def merchant(name: str) -> Principal:
    return Principal(f"admin-{name}", "admin", f"merchant-{name}-{uuid.uuid4().hex[:6]}")


@pytest_asyncio.fixture
async def worker_pool(pg, checkout_pool):
    """The workers' own pool: in Kubernetes they are a process of their own, apart from the API."""
    pool = await create_pool(with_database(pg.dsn, "cuty_payments_checkout_it"), min_size=1, max_size=8)
    yield pool
    await pool.close()


async def publish(pool, merchant_id: str, endpoint_ids: list[str]) -> str:
    """An event and its deliveries, as the outbox trigger writes them, and the workers' wake-up."""
    event = uuid.uuid4()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO merchant_events (merchant_id, id, type, payload) "
                           "VALUES ($1, $2, 'checkout.completed', $3::jsonb)", merchant_id, event,
                           {"id": str(event), "type": "checkout.completed", "merchant_id": merchant_id,
                            "data": {"checkout": {"id": str(uuid.uuid4())}}})  # the pool's jsonb codec encodes
        await conn.execute("INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, next_attempt_at, "
                           "give_up_at) SELECT $1, e, $2, clock_timestamp(), clock_timestamp() + interval '3 days' "
                           "FROM unnest($3::uuid[]) e", merchant_id, event, [uuid.UUID(e) for e in endpoint_ids])
        await conn.execute("NOTIFY cuty_merchant_events")
    return str(event)


@contextlib.asynccontextmanager
async def running(workers):
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield tasks
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def settled(pool, merchant_id: str) -> None:
    """Until no delivery of the merchant is pending (the receiver hears an event before its result is written)."""
    async def none_pending():
        return not await pool.fetchval("SELECT count(*) FROM webhook_deliveries WHERE merchant_id = $1 "
                                       "AND state = 'pending'", merchant_id)
    await wait_for(none_pending, timeout=10, message="no delivery pending")


LIVE_LEASES = """
SELECT endpoint_id, count(*) AS n FROM webhook_deliveries
WHERE merchant_id = $1 AND lease_owner IS NOT NULL AND lease_until > clock_timestamp() GROUP BY endpoint_id
"""


async def test_a_merchant_with_16_hanging_endpoints_and_a_redeliver_storm_cannot_stall_another(
        checkout_pool, worker_pool):
    noisy, calm = merchant("noisy"), merchant("calm")
    api = WebhookEndpoints(Endpoints(checkout_pool), "development", allow_private=True, redeliver_per_minute=3,
                           metrics=RedeliveryMetrics())
    # Two workers of 8 slots: without caps the noisy merchant's backlog (and its redeliveries, due
    # at once) would fill every slot for a whole timeout, round after round.
    options = dataclasses.replace(FAST, timeout_seconds=3.0, lease_seconds=10.0, concurrency=8, batch_size=8,
                                  endpoint_concurrency=2, merchant_concurrency=4, circuit_failures=50)
    metrics = OutboundMetrics()
    async with HostileEndpoint() as bad, Receiver() as rx:
        hanging = [await api.create(noisy, bad.url("hang", 200), ["checkout.completed"]) for _ in range(16)]
        good = await api.create(calm, rx.url, ["checkout.completed"])
        rx.secrets.append(good.secret)
        for _ in range(10):  # 160 deliveries due before the calm merchant's event
            await publish(checkout_pool, noisy.org, [e.id for e in hanging])
        noisy_deliveries = [(str(r["endpoint_id"]), str(r["id"])) for r in await checkout_pool.fetch(
            "SELECT endpoint_id, id FROM webhook_deliveries WHERE merchant_id = $1", noisy.org)]

        peak = {"merchant": 0, "endpoint": 0}
        outcomes: dict[str, int] = {}
        stop = asyncio.Event()

        async def sample_leases():
            while not stop.is_set():
                per_endpoint = [r["n"] for r in await checkout_pool.fetch(LIVE_LEASES, noisy.org)]
                peak["merchant"] = max(peak["merchant"], sum(per_endpoint))
                peak["endpoint"] = max(peak["endpoint"], max(per_endpoint, default=0))
                await asyncio.sleep(0.02)

        async def redeliver(endpoint_id, delivery_id):
            try:
                await api.redeliver(noisy, endpoint_id, delivery_id)
                key = "queued"
            except errors.ResourceExhausted as e:
                key = e.reason
            except errors.FailedPrecondition as e:
                key = e.reason
            outcomes[key] = outcomes.get(key, 0) + 1

        async def storm():
            while not stop.is_set():  # every noisy delivery, 16 at a time, again and again
                for i in range(0, len(noisy_deliveries), 16):
                    await asyncio.gather(*(redeliver(*d) for d in noisy_deliveries[i:i + 16]))

        workers = [DeliveryWorker(worker_pool, f"fair-{i}", options, metrics=metrics) for i in range(2)]
        async with running(workers):
            sampler, storming = asyncio.create_task(sample_leases()), asyncio.create_task(storm())
            try:
                await wait_for(lambda: bad.hanging >= 4, timeout=10, message="the noisy merchant's endpoints hanging")
                loop = asyncio.get_running_loop()
                events = []
                for _ in range(3):  # the calm merchant's events, one after the other, during the storm
                    t0 = loop.time()
                    events.append(await publish(checkout_pool, calm.org, [good.id]))
                    await rx.until(lambda evs: events[-1] in evs, timeout=10)
                    print(f"calm merchant's event delivered in {loop.time() - t0:.2f} s "
                          f"(noisy endpoints hanging: {bad.hanging})")
                await asyncio.sleep(options.timeout_seconds + 0.5)  # through a round of timeouts too
                events.append(await publish(checkout_pool, calm.org, [good.id]))
                await rx.until(lambda evs: events[-1] in evs, timeout=10)
                await settled(checkout_pool, calm.org)
            finally:
                stop.set()
                await asyncio.gather(sampler, storming)
    print(f"peak leases: {peak}; redeliveries: {outcomes}; hanging requests: {len(bad.requests)}")
    # The caps held across both workers, all along (the database counted the leases).
    assert 0 < peak["merchant"] <= options.merchant_concurrency
    assert 0 < peak["endpoint"] <= options.endpoint_concurrency
    # The storm: at most 3 a minute per endpoint were queued, the rest refused with a reason.
    assert 0 < outcomes.get("queued", 0) <= 3 * 16
    assert outcomes.get("redeliver-rate-limited", 0) > 0
    # Every hanging attempt ended with its own timeout, logged as a class.
    assert metrics.value(DELIVERIES, outcome="retrying", error="timeout") > 0
    assert metrics.value(DELIVERIES, outcome="delivered", error="") == 4
    errors_logged = {r["error"] for r in await checkout_pool.fetch(
        "SELECT DISTINCT error FROM webhook_attempts WHERE merchant_id = $1", noisy.org)}
    assert errors_logged == {"timeout"}


async def test_a_failing_endpoint_opens_its_circuit_probes_alone_then_closes(checkout_pool, worker_pool):
    shop = merchant("circuit")
    api = WebhookEndpoints(Endpoints(checkout_pool), "development", allow_private=True, metrics=RedeliveryMetrics())
    options = dataclasses.replace(FAST, circuit_failures=3, circuit_open_seconds=1.5, circuit_max_open_seconds=5.0,
                                  endpoint_concurrency=4)
    metrics = OutboundMetrics()
    # Four 500s: three open the circuit, the first half-open probe fails and opens it for twice as long.
    async with Receiver(fail_first=4, delay=0.05) as rx:
        ep = await api.create(shop, rx.url, ["checkout.completed"])
        rx.secrets.append(ep.secret)
        first = await publish(checkout_pool, shop.org, [ep.id])
        async with running([DeliveryWorker(worker_pool, "circuit-0", options, metrics=metrics),
                            DeliveryWorker(worker_pool, "circuit-1", options, metrics=metrics)]):
            async def opened():
                return await checkout_pool.fetchval(
                    "SELECT circuit_open_until > clock_timestamp() FROM webhook_endpoints WHERE id = $1",
                    uuid.UUID(ep.id))
            await wait_for(opened, timeout=10, message="the circuit open")
            assert len(rx.requests) == 3
            later = [await publish(checkout_pool, shop.org, [ep.id]) for _ in range(5)]  # due while it is open
            await asyncio.sleep(0.4)
            assert len(rx.requests) == 3  # nothing is sent while open
            await rx.until(lambda evs: set(evs) == {first, *later}, timeout=15)
            await settled(checkout_pool, shop.org)
        row = await checkout_pool.fetchrow("SELECT consecutive_failures, circuit_open_until FROM webhook_endpoints "
                                           "WHERE id = $1", uuid.UUID(ep.id))
    assert dict(row) == {"consecutive_failures": 0, "circuit_open_until": None}  # closed again
    starts = sorted(rx.spans)
    # attempt 4 (the first probe) at least 1.5 s after attempt 3; attempt 5 (the second) 3 s after it
    assert starts[3][0] - starts[2][1] >= 1.4 and starts[4][0] - starts[3][1] >= 2.9, starts[:6]
    # each probe ran alone: the next request started only after it had ended
    for probe in (3, 4):
        assert all(s >= starts[probe][1] for s, _ in starts[probe + 1:]), (probe, starts)
    assert metrics.value("cuty_payments_webhook_circuits_opened_total") == 1
    assert metrics.value(DELIVERIES, outcome="retrying", error="http_500") == 4
    assert metrics.value(DELIVERIES, outcome="delivered", error="") == 6
    await metrics.refresh(DeliveryWorker(worker_pool, "gauges", options, metrics=metrics).deliveries)
    assert metrics.value("cuty_payments_webhook_circuits_open") == 0
    assert metrics.value("cuty_payments_webhook_backlog") == 0


class NamesTo(aiohttp.abc.AbstractResolver):
    """A resolver that answers `answers[name]`: a merchant's DNS, rebinding a name to an inside address."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers

    async def resolve(self, host, port=0, family=socket.AF_INET):
        return [{"hostname": host, "host": self.answers[host], "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": 0}]

    async def close(self):
        pass


async def test_a_url_that_resolves_inside_is_refused_when_connecting(checkout_pool, worker_pool):
    """Registered while public (or as a name), the URL resolves to 127.0.0.1 when delivering: the
    worker refuses at connect time, nothing reaches the receiver, the log says `forbidden_address`.
    The same deliveries with the development allowance do reach it (so the refusal is the guard's)."""
    shop = merchant("ssrf")
    api = WebhookEndpoints(Endpoints(checkout_pool), "development", allow_private=True, metrics=RedeliveryMetrics())
    async with Receiver() as rx:
        urls = [f"http://rebound.example:{rx.port}/hooks",       # a name resolving to 127.0.0.1
                rx.url,                                          # the IP literal 127.0.0.1
                f"http://[::ffff:127.0.0.1]:{rx.port}/hooks"]    # IPv4-mapped IPv6
        eps = [await api.create(shop, "https://rebound.example/hooks", ["checkout.completed"]) for _ in urls]
        for ep, url in zip(eps, urls):  # the local receiver speaks plain HTTP (registration wants https)
            await checkout_pool.execute("UPDATE webhook_endpoints SET url = $2 WHERE id = $1", uuid.UUID(ep.id), url)
        rx.secrets.extend(e.secret for e in eps)
        event = await publish(checkout_pool, shop.org, [e.id for e in eps])
        resolver = NamesTo({"rebound.example": "127.0.0.1"})
        options = dataclasses.replace(FAST, allow_private=False, circuit_failures=1000)
        metrics = OutboundMetrics()

        def client(egress: Egress) -> aiohttp.ClientSession:
            return aiohttp.ClientSession(connector=connector(egress, limit=8, resolver=resolver), auto_decompress=False,
                                         timeout=aiohttp.ClientTimeout(total=options.timeout_seconds))

        async with client(options.egress("development")) as guarded:
            async with running([DeliveryWorker(worker_pool, "guarded", options, client=guarded, metrics=metrics)]):
                async def all_refused_twice():
                    return await checkout_pool.fetchval(
                        "SELECT count(*) FROM webhook_attempts WHERE merchant_id = $1", shop.org) >= 2 * len(eps)
                await wait_for(all_refused_twice, timeout=10, message="every delivery refused")
        assert rx.requests == []
        attempts = await checkout_pool.fetch("SELECT http_status, error FROM webhook_attempts WHERE merchant_id = $1",
                                             shop.org)
        assert {(a["http_status"], a["error"]) for a in attempts} == {(0, "forbidden_address")}
        assert metrics.value(DELIVERIES, outcome="retrying", error="forbidden_address") >= 2 * len(eps)
        # what the admin reads: the class, nothing about the address or the socket
        log, _ = await api.deliveries(shop, eps[0].id, 0, "")
        assert {a["error"] for a in log[0].attempt_log} == {"forbidden_address"}

        allowed = dataclasses.replace(options, allow_private=True)
        async with client(allowed.egress("development")) as open_client:
            async with running([DeliveryWorker(worker_pool, "allowed", allowed, client=open_client,
                                               metrics=OutboundMetrics())]):
                await rx.until(lambda evs: event in evs)
                await wait_for(lambda: len(rx.requests) == len(eps), timeout=10, message="every URL reached")
