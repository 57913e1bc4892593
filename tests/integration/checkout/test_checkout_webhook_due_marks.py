"""The delivery workers' claim starts from the merchants with something due (webhook_merchants_due),
so its cost follows the deliveries due, not the merchants that subscribe; and no delivery is ever
left behind by it: whatever makes a delivery due (written, retried, redelivered) marks its merchant
in the same transaction, and the claim moves or removes a mark only when nothing committed says
otherwise. Real database, real concurrency: writers and claimers racing, the tables checked after."""
from __future__ import annotations

import asyncio
import datetime as dt
import random
import uuid

import asyncpg
import pytest

from cutylib.testing.procs import wait_for
from payments.outbound.repository import Deliveries, Endpoints, Limits
from payments.outbound.service import WebhookEndpoints
from payments.outbound.metrics import RedeliveryMetrics

from test_checkout_webhook_fairness import merchant, publish, worker_pool  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("clean_endpoints")

MARKS = "SELECT merchant_id, due_at, due_at <= clock_timestamp() AS due FROM webhook_merchants_due WHERE merchant_id = ANY ($1)"


async def marks(pool, merchants: list[str]) -> dict[str, dict]:
    return {r["merchant_id"]: dict(r) for r in await pool.fetch(MARKS, merchants)}


async def finish_all(deliveries: Deliveries, claimed, *, delivered: bool = True, retry_in: float = 0.0) -> None:
    for c in claimed:
        await deliveries.finish(c, "w", delivered=delivered, retry_in=retry_in, started_at=c.db_now,
                                http_status=200 if delivered else 500, error="" if delivered else "http_500",
                                duration_ms=1)


async def test_a_mark_follows_its_merchants_deliveries_and_leaves_when_nothing_is_pending(checkout_pool, worker_pool):
    api = WebhookEndpoints(Endpoints(checkout_pool), "development", allow_private=True, redeliver_per_minute=10,
                           metrics=RedeliveryMetrics())
    shop, idle = merchant("marked"), merchant("idle")
    ep = await api.create(shop, "http://127.0.0.1:9/hooks", ["checkout.completed"])
    await api.create(idle, "http://127.0.0.1:9/hooks", ["checkout.completed"])
    deliveries = Deliveries(worker_pool, limits=Limits(circuit_failures=100))
    who = [shop.org, idle.org]

    # Subscribed but nothing written: no mark, nothing claimed.
    assert await marks(checkout_pool, who) == {}
    assert await deliveries.claim_due("w", 20, 30.0) == []

    # An event: its merchant is due, in the event's transaction; the other merchant is not.
    await publish(checkout_pool, shop.org, [ep.id])
    got = await marks(checkout_pool, who)
    assert list(got) == [shop.org] and got[shop.org]["due"]

    # Claimed: the mark waits for the lease's end (a worker that dies leaves it due then).
    claimed = await deliveries.claim_due("w", 20, 30.0)
    assert [c.merchant_id for c in claimed] == [shop.org]
    got = await marks(checkout_pool, who)
    assert not got[shop.org]["due"]
    lease_end = await checkout_pool.fetchval(
        "SELECT next_attempt_at FROM webhook_deliveries WHERE merchant_id = $1", shop.org)
    assert got[shop.org]["due_at"] == lease_end

    # A failed attempt: due again at its retry, which is sooner than the lease's end.
    await finish_all(deliveries, claimed, delivered=False, retry_in=1.5)
    retry_at = await checkout_pool.fetchval(
        "SELECT next_attempt_at FROM webhook_deliveries WHERE merchant_id = $1", shop.org)
    assert (await marks(checkout_pool, who))[shop.org]["due_at"] <= retry_at < lease_end
    assert await deliveries.claim_due("w", 20, 30.0) == []  # not due yet
    await asyncio.sleep(1.6)
    claimed = await deliveries.claim_due("w", 20, 30.0)
    assert [c.id for c in claimed] == [str((await checkout_pool.fetchval(
        "SELECT id FROM webhook_deliveries WHERE merchant_id = $1", shop.org)))]

    # Delivered: the next claim finds nothing pending and removes the mark.
    await finish_all(deliveries, claimed)
    await checkout_pool.execute("UPDATE webhook_merchants_due SET due_at = clock_timestamp() WHERE merchant_id = $1",
                                shop.org)
    assert await deliveries.claim_due("w", 20, 30.0) == []
    assert await marks(checkout_pool, who) == {}

    # A redelivery makes it due again, in the statement that queues it.
    (delivery,), _ = await api.deliveries(shop, ep.id, 10, "")
    await api.redeliver(shop, ep.id, delivery.id)
    assert (await marks(checkout_pool, who))[shop.org]["due"]
    assert [c.id for c in await deliveries.claim_due("w", 20, 30.0)] == [delivery.id]


async def test_an_open_circuit_holds_the_mark_until_it_half_opens(checkout_pool, worker_pool):
    api = WebhookEndpoints(Endpoints(checkout_pool), "development", allow_private=True, redeliver_per_minute=10,
                           metrics=RedeliveryMetrics())
    shop = merchant("circuit")
    ep = await api.create(shop, "http://127.0.0.1:9/hooks", ["checkout.completed"])
    deliveries = Deliveries(worker_pool, limits=Limits(circuit_failures=1, circuit_open_seconds=60.0))
    for _ in range(3):
        await publish(checkout_pool, shop.org, [ep.id])
    claimed = await deliveries.claim_due("w", 20, 30.0)
    assert len(claimed) == 3
    await finish_all(deliveries, claimed, delivered=False, retry_in=0.0)  # the first failure opens it
    open_until = await checkout_pool.fetchval(
        "SELECT circuit_open_until FROM webhook_endpoints WHERE merchant_id = $1", shop.org)
    assert open_until > dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=30)
    # Its deliveries are due, but none may be claimed: the next claim moves the mark to the half-open.
    await checkout_pool.execute("UPDATE webhook_merchants_due SET due_at = clock_timestamp() WHERE merchant_id = $1",
                                shop.org)
    assert await deliveries.claim_due("w", 20, 30.0) == []
    assert (await marks(checkout_pool, [shop.org]))[shop.org]["due_at"] == open_until
    # The circuit closed early (a success from elsewhere): due now.
    await checkout_pool.execute("UPDATE webhook_endpoints SET circuit_open_until = NULL, consecutive_failures = 0 "
                                "WHERE merchant_id = $1", shop.org)
    assert (await marks(checkout_pool, [shop.org]))[shop.org]["due"]
    assert len(await deliveries.claim_due("w", 20, 30.0)) == 3


async def test_writers_and_claimers_racing_leave_no_delivery_behind(checkout_pool, worker_pool):
    """Events written for a few merchants from several connections at once while two claimers claim,
    fail some attempts (retries due soon) and deliver the rest: once the writers stop, every delivery
    ends delivered, claimed only through the marks, and no mark is left."""
    api = WebhookEndpoints(Endpoints(checkout_pool), "development", allow_private=True, redeliver_per_minute=10,
                           metrics=RedeliveryMetrics())
    shops = [merchant(f"race{i}") for i in range(4)]
    endpoints = {s.org: [(await api.create(s, "http://127.0.0.1:9/hooks", ["checkout.completed"])).id
                         for _ in range(2)] for s in shops}
    deliveries = Deliveries(worker_pool, limits=Limits(endpoint_in_flight=50, merchant_in_flight=100,
                                                       circuit_failures=10_000))
    rng = random.Random(26)
    writing = asyncio.Event()
    writing.set()
    written = 0

    async def writer(n: int):
        nonlocal written
        for _ in range(n):
            s = rng.choice(shops)
            await publish(checkout_pool, s.org, endpoints[s.org])
            written += 1

    async def claimer(name: str):
        while True:
            claimed = await deliveries.claim_due(name, 10, 30.0)
            for c in claimed:
                ok = rng.random() < 0.7
                await deliveries.finish(c, name, delivered=ok, retry_in=0.0 if ok else 0.05, started_at=c.db_now,
                                        http_status=200 if ok else 500, error="" if ok else "http_500",
                                        duration_ms=1)
            if not claimed:
                if not writing.is_set():
                    pending = await checkout_pool.fetchval(
                        "SELECT count(*) FROM webhook_deliveries WHERE merchant_id = ANY ($1) AND state = 'pending'",
                        [s.org for s in shops])
                    if not pending:
                        return
                await asyncio.sleep(0.01)

    claimers = [asyncio.create_task(claimer(f"racer-{i}")) for i in range(2)]
    await asyncio.gather(*(writer(40) for _ in range(4)))
    writing.clear()
    # Every delivery is delivered within a bound: a delivery whose mark was lost would stay pending.
    await asyncio.wait_for(asyncio.gather(*claimers), timeout=60)
    rows = await checkout_pool.fetch(
        "SELECT state, count(*) AS n FROM webhook_deliveries WHERE merchant_id = ANY ($1) GROUP BY state",
        [s.org for s in shops])
    assert {r["state"]: r["n"] for r in rows} == {"delivered": written * 2}
    # Nothing pending: the next claim removes every mark that is left.
    await checkout_pool.execute("UPDATE webhook_merchants_due SET due_at = clock_timestamp() "
                                "WHERE merchant_id = ANY ($1)", [s.org for s in shops])
    assert await deliveries.claim_due("w", 20, 30.0) == []
    assert await marks(checkout_pool, [s.org for s in shops]) == {}


async def test_writers_that_find_the_mark_moved_later_meanwhile_do_not_deadlock(checkout_pool):
    """Two writers probe a due mark while a worker moves it later; once the worker commits, both find
    it not due and move it sooner: one after the other, with no deadlock. (A FOR SHARE probe locks
    the moved mark before it re-checks it, and kept that lock when the re-check failed: each writer
    then waited for the other's share to update the mark.)"""
    shop = merchant("moved")
    await checkout_pool.execute("INSERT INTO webhook_merchants_due (merchant_id, due_at) "
                                "VALUES ($1, clock_timestamp() - interval '1 second')", shop.org)
    async with checkout_pool.acquire() as worker, checkout_pool.acquire() as a, checkout_pool.acquire() as b:
        moving = worker.transaction()
        await moving.start()
        await worker.execute("UPDATE webhook_merchants_due SET due_at = clock_timestamp() + interval '1 hour' "
                             "WHERE merchant_id = $1", shop.org)
        writers = {}
        for conn in (a, b):
            tx = conn.transaction()
            await tx.start()
            writers[asyncio.create_task(conn.execute("SELECT webhook_merchant_due($1, clock_timestamp())",
                                                     shop.org))] = tx
        await wait_for(lambda: checkout_pool.fetchval(
            "SELECT count(*) = 2 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'SELECT webhook_merchant_due%'"), message="both writers waiting for the worker")
        await moving.commit()
        pending = set(writers)
        while pending:  # the first to update the mark holds it until it commits; the other waits
            done, pending = await asyncio.wait(pending, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert done, "a writer still waiting"
            for task in done:
                task.result()  # no deadlock detected
                await writers[task].commit()
    got = await marks(checkout_pool, [shop.org])
    assert got[shop.org]["due"]
