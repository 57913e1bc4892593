"""`stock.low` from the code pool's outbox to a merchant's endpoint. A real code
pool (in process, its own database) writes the event with the stock change; the orchestrator's relay
stores it in merchant_events with its deliveries and its cursor in one transaction; a crash of the
relay before its commit stores nothing and the next round stores the event once; a re-read event is
stored once; two replicas relay each event once; a signed POST reaches a real receiver."""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os

import asyncpg
import grpc
import pytest
import pytest_asyncio

from cuty.codepool.v1 import codepool_pb2 as cp, codepool_pb2_grpc
from cuty.common.v1 import common_pb2
from cutylib.config import Settings
from cutylib.db import create_pool
from cutylib.principal import Principal
from cutylib.testing.ids import new_id
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import TEST_MERCHANT, acting_channel, user
from codepool.bootstrap import create_server as create_codepool
from codepool.grpc_api import CALLERS as CODEPOOL_CALLERS
from codepool.keys import Keyring
from payments import signature
from payments.outbound.relay import FEED, RelayOptions, StockEventRelay
from payments.outbound.worker import DeliveryWorker

from outbound_testkit import FAST
from webhook_receiver import Receiver

pytestmark = pytest.mark.usefixtures("clean_endpoints")

ADMIN = Principal("admin-1", "admin", TEST_MERCHANT)
ADMIN_MD = user("admin-1", "admin")


@pytest_asyncio.fixture(scope="module")
async def codepool(codepool_dsn):
    """The code pool, in process: a stub as the orchestrator (system) and as the merchant's admin."""
    pool = await create_pool(codepool_dsn, min_size=2, max_size=20, application_name="stock-relay-tests")
    keyring = Keyring(keys={"t1": os.urandom(32)}, active="t1",
                      hash_key=hashlib.sha256(b"cuty codepool tests: hash key").digest())
    server = await create_codepool(Settings(), pool, keyring=keyring)
    await server.start()
    async with acting_channel(f"127.0.0.1:{server.port}", "codepool", CODEPOOL_CALLERS, deadline_seconds=30) as ch:
        yield codepool_pb2_grpc.CodePoolServiceStub(ch)
    await server.stop()
    await pool.close()


def relay(pool, stub, page_size: int = 200) -> StockEventRelay:
    return StockEventRelay(pool, stub, RelayOptions(poll_seconds=0.05, page_size=page_size))


async def low_product(stub, threshold: int = 2, stock: int = 4) -> str:
    """A product stocked above its threshold (armed)."""
    p = await stub.CreateProduct(cp.CreateProductRequest(
        sku="sku-" + new_id()[:12], name="E-pin 100", price=common_pb2.Money(currency_code="TRY", amount_minor=10000),
        low_stock_threshold=threshold), metadata=ADMIN_MD)
    await stub.ImportCodeBatch(cp.ImportCodeBatchRequest(product_id=p.id, batch_ref="b-" + new_id(),
                                                         codes=[f"EPIN-{new_id()}" for _ in range(stock)]),
                               metadata=ADMIN_MD)
    return p.id


async def sell(stub, product_id: str, n: int) -> None:
    order = "ord-" + new_id()
    await stub.ReserveCodes(cp.ReserveCodesRequest(order_id=order, order_item_id=order + "/1", product_id=product_id,
                                                   quantity=n, customer_id="cust-" + new_id()))


async def cross(stub, threshold: int = 2) -> str:
    """A product whose stock just dropped to its threshold: one stock.low in the code pool."""
    pid = await low_product(stub, threshold, threshold + 2)
    await sell(stub, pid, 2)
    return pid


async def stored(pool, product_id: str) -> list:
    return await pool.fetch("SELECT id, type, payload, checkout_id FROM merchant_events "
                            "WHERE type = 'stock.low' AND payload->'data'->'product'->>'id' = $1", product_id)


async def cursor(pool) -> int:
    return await pool.fetchval("SELECT after_seq FROM outbound_feeds WHERE feed = $1", FEED)


async def test_stock_low_reaches_a_registered_endpoint_signed(checkout_pool, codepool, endpoints):
    async with Receiver() as rx:
        ep = await endpoints.create(ADMIN, rx.url, ["stock.low"])
        rx.secrets.append(ep.secret)
        pid = await cross(codepool)
        await relay(checkout_pool, codepool).relay_once()
        [ev] = await stored(checkout_pool, pid)
        assert ev["checkout_id"] is None
        worker = DeliveryWorker(checkout_pool, "relay-test-worker", FAST)
        task = asyncio.create_task(worker.run())
        try:
            await rx.until(lambda evs: any(e["type"] == "stock.low" and e["data"]["product"]["id"] == pid
                                           for e in evs.values()))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    [got] = [e for e in rx.events.values() if e["type"] == "stock.low" and e["data"]["product"]["id"] == pid]
    assert got["id"] == str(ev["id"]) and got["merchant_id"] == TEST_MERCHANT
    assert got["data"]["product"]["available"] == 2 and got["data"]["product"]["low_stock_threshold"] == 2
    [req] = [r for r in rx.requests if json.loads(r["body"])["id"] == got["id"]]
    assert req["headers"]["cuty-event-type"] == "stock.low" and req["headers"]["cuty-event-id"] == got["id"]
    signature.verify(req["headers"]["cuty-signature"], req["body"], [ep.secret])
    assert rx.rejected == 0


async def test_a_relay_crash_before_its_commit_stores_nothing_then_the_next_round_stores_once(checkout_pool, codepool,
                                                                                           endpoints):
    ep = await endpoints.create(ADMIN, "https://hooks.example.com/stock", ["stock.low"])
    await relay(checkout_pool, codepool).relay_once()          # drain what other tests left
    before = await cursor(checkout_pool)
    pid = await cross(codepool)

    backends = []

    async def die(conn):
        # the relay's process dies after it stored the page, before the commit: its socket closes
        backends.append(conn.get_server_pid())
        conn.terminate()

    async def killed(conn):
        # ... or the database kills its session (a failover, an operator)
        backends.append(conn.get_server_pid())
        await checkout_pool.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())

    for crash in (die, killed):
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)):
            await relay(checkout_pool, codepool).relay_page(before_commit=crash)
        # until the server has ended the dead session, its lock keeps other replicas off the feed
        await wait_for(lambda: _gone(checkout_pool, backends[-1]), timeout=10, message="the dead session to end")
        assert await stored(checkout_pool, pid) == [] and await cursor(checkout_pool) == before
    # a crash in the relay's own code at the same point: rolled back the same way
    with pytest.raises(RuntimeError):
        await relay(checkout_pool, codepool).relay_page(before_commit=_raise)
    assert await stored(checkout_pool, pid) == [] and await cursor(checkout_pool) == before

    assert await relay(checkout_pool, codepool).relay_once() >= 1
    [ev] = await stored(checkout_pool, pid)
    assert await cursor(checkout_pool) > before
    deliveries = await checkout_pool.fetch("SELECT endpoint_id FROM webhook_deliveries WHERE event_id = $1", ev["id"])
    assert [str(d["endpoint_id"]) for d in deliveries] == [ep.id]
    # the cursor never goes back, and an event read again (a rewound read) is stored and fanned out once
    with pytest.raises(asyncpg.CheckViolationError):
        await checkout_pool.execute("UPDATE outbound_feeds SET after_seq = 0 WHERE feed = $1", FEED)
    assert await relay(checkout_pool, _Rewinding(codepool)).relay_once() == 0
    assert len(await stored(checkout_pool, pid)) == 1
    assert await checkout_pool.fetchval("SELECT count(*) FROM webhook_deliveries WHERE event_id = $1", ev["id"]) == 1


async def test_the_code_pool_away_changes_nothing(checkout_pool, codepool):
    await relay(checkout_pool, codepool).relay_once()
    before = await cursor(checkout_pool)
    pid = await cross(codepool)
    async with acting_channel("127.0.0.1:9", "codepool", CODEPOOL_CALLERS, deadline_seconds=2) as ch:
        with pytest.raises(grpc.aio.AioRpcError):
            await relay(checkout_pool, codepool_pb2_grpc.CodePoolServiceStub(ch)).relay_once()
    assert await cursor(checkout_pool) == before and await stored(checkout_pool, pid) == []
    await relay(checkout_pool, codepool).relay_once()
    assert len(await stored(checkout_pool, pid)) == 1


async def test_replicas_relay_each_event_once_and_one_at_a_time(checkout_pool, codepool, endpoints):
    await endpoints.create(ADMIN, "https://hooks.example.com/stock", ["stock.low"])
    await relay(checkout_pool, codepool).relay_once()
    # while one replica holds the feed, another skips its round instead of relaying the same events
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold(_conn):
        holding.set()
        await release.wait()

    pid = await cross(codepool)
    first = asyncio.create_task(relay(checkout_pool, codepool).relay_page(before_commit=hold))
    await asyncio.wait_for(holding.wait(), 10)
    assert await relay(checkout_pool, codepool).relay_page() is None
    release.set()
    assert (await first)[0] >= 1
    assert len(await stored(checkout_pool, pid)) == 1
    # many crossings while three replicas relay in small pages, concurrently
    replicas = [relay(checkout_pool, codepool, page_size=2) for _ in range(3)]
    sales = asyncio.gather(*(cross(codepool) for _ in range(12)))
    rounds = asyncio.gather(*(r.relay_once() for r in replicas for _ in range(5)))
    pids = await sales
    await rounds
    await replicas[0].relay_once()
    for p in pids:
        [ev] = await stored(checkout_pool, p)
        assert await checkout_pool.fetchval("SELECT count(*) FROM webhook_deliveries WHERE event_id = $1", ev["id"]) == 1


async def _gone(pool, backend_pid: int) -> bool:
    return await pool.fetchval("SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", backend_pid)


async def _raise(_conn):
    raise RuntimeError("crash injected")


@dataclasses.dataclass
class _Rewinding:
    """A code pool answer that repeats the last event the relay already stored."""
    stub: object

    async def ListStockEvents(self, request, **kw):
        return await self.stub.ListStockEvents(cp.ListStockEventsRequest(after_seq=max(0, request.after_seq - 1),
                                                                         page_size=request.page_size), **kw)
