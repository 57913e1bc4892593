"""`stock.low`. The statement that drops a product's available codes to or below
its threshold writes one event into the code pool's outbox (stock_events), on the crossing only;
stock coming back above the threshold re-arms it; concurrent reservations crossing together write
one; a change rolled back or killed before its commit leaves no event; ListStockEvents reads them
out after a cursor, for the orchestrator alone. A statement far from a decision takes the lock-free
fast path (codepool_stock_changed); the recheck re-decides what a race on it left behind."""
from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from cuty.common.v1 import common_pb2
from cutylib.grpc_errors import bad_field
from cutylib.testing.ids import new_id

from codepool.service import ReservationService
from codepool.stock_events import StockEvents
from codepool_testkit import ADMIN, STAFF, make_codes, reserve_request, stock_of


async def product(stub, threshold: int | None, stock: int = 0) -> str:
    req = pb.CreateProductRequest(sku="sku-" + new_id()[:12], name="Gift card 50",
                                  price=common_pb2.Money(currency_code="TRY", amount_minor=5000))
    if threshold is not None:
        req.low_stock_threshold = threshold
    p = await stub.CreateProduct(req, metadata=ADMIN)
    if stock:
        await restock(stub, p.id, stock)
    return p.id


async def restock(stub, product_id: str, n: int) -> None:
    resp = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b-" + new_id(),
                                                                codes=make_codes(n)), metadata=ADMIN)
    assert resp.accepted and resp.imported == n


async def events(pool, product_id: str) -> list[dict]:
    rows = await pool.fetch("SELECT payload FROM stock_events WHERE product_id = $1 ORDER BY seq", uuid.UUID(product_id))
    return [json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"] for r in rows]


async def reserve(stub, product_id: str, n: int) -> pb.Reservation:
    return await stub.ReserveCodes(reserve_request(product_id, n))


async def test_the_crossing_writes_one_event_and_only_the_crossing(stub, cp_pool):
    pid = await product(stub, 3, stock=6)
    assert await events(cp_pool, pid) == []            # stocked above the threshold: armed, nothing said
    await reserve(stub, pid, 2)                        # 4 left
    assert await events(cp_pool, pid) == []
    await reserve(stub, pid, 1)                        # 3 left: at the threshold
    [ev] = await events(cp_pool, pid)
    assert ev["type"] == "stock.low" and ev["merchant_id"] == "merchant-test"
    uuid.UUID(ev["id"])
    assert ev["data"]["product"] == {"id": pid, "sku": ev["data"]["product"]["sku"], "name": "Gift card 50",
                                     "available": 3, "low_stock_threshold": 3}
    await reserve(stub, pid, 1)                        # below: nothing more
    await reserve(stub, pid, 2)                        # sold out: nothing more
    assert len(await events(cp_pool, pid)) == 1
    assert await stock_of(stub, pid) == (0, 6, 0)


async def test_replenishing_above_the_threshold_re_arms(stub, cp_pool):
    pid = await product(stub, 2, stock=4)
    first = await reserve(stub, pid, 2)                # 2 left: event 1
    assert len(await events(cp_pool, pid)) == 1
    # a release puts the stock back above the threshold: re-armed, and no event for rising
    await ReservationService(cp_pool, ttl_seconds=60).release(first.order_id, "system")
    assert len(await events(cp_pool, pid)) == 1
    assert await cp_pool.fetchval("SELECT stock_low FROM products WHERE id = $1", uuid.UUID(pid)) is False
    await reserve(stub, pid, 2)                        # down again: event 2
    assert len(await events(cp_pool, pid)) == 2
    await restock(stub, pid, 1)                        # 3 > 2: re-armed by the import
    await reserve(stub, pid, 1)                        # 2: event 3
    evs = await events(cp_pool, pid)
    assert [e["data"]["product"]["available"] for e in evs] == [2, 2, 2]
    assert len({e["id"] for e in evs}) == 3
    assert await cp_pool.fetchval("SELECT stock_low FROM products WHERE id = $1", uuid.UUID(pid)) is True


async def test_a_new_product_is_announced_only_after_it_was_stocked_above_its_threshold(stub, cp_pool):
    pid = await product(stub, None)                    # the default threshold, 10
    assert await cp_pool.fetchval("SELECT low_stock_threshold FROM products WHERE id = $1", uuid.UUID(pid)) == 10
    await restock(stub, pid, 5)                        # 5 <= 10: low from the start, nothing to announce
    await reserve(stub, pid, 1)
    assert await events(cp_pool, pid) == []
    await restock(stub, pid, 10)                       # 14 > 10
    await reserve(stub, pid, 4)                        # 10
    assert [e["data"]["product"]["available"] for e in await events(cp_pool, pid)] == [10]
    zero = await product(stub, 0, stock=2)             # 0: announced when sold out
    await reserve(stub, zero, 1)
    assert await events(cp_pool, zero) == []
    await reserve(stub, zero, 1)
    assert [e["data"]["product"]["available"] for e in await events(cp_pool, zero)] == [0]


@pytest.mark.parametrize("threshold", [-1, 1_000_001])
async def test_a_bad_threshold_is_refused_naming_the_field(stub, threshold):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await product(stub, threshold)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == "low_stock_threshold"


async def test_concurrent_reservations_crossing_together_write_one_event(stub, cp_pool):
    for _ in range(3):
        pid = await product(stub, 20, stock=40)
        # 40 buyers at once, one code each: the stock passes 20 while many are in flight
        got = await asyncio.gather(*(reserve(stub, pid, 1) for _ in range(40)))
        assert len({c for r in got for c in r.code_ids}) == 40
        assert len(await events(cp_pool, pid)) <= 1  # never two for one crossing
        # Racing reservations may all have seen "above" on the fast path: the recheck (run by the code
        # pool every few seconds) announces then, once; a second recheck finds nothing to do.
        await StockEvents(cp_pool).recheck()
        assert await StockEvents(cp_pool).recheck() == 0
        [ev] = await events(cp_pool, pid)
        assert ev["data"]["product"]["available"] <= 20
        assert await cp_pool.fetchval("SELECT stock_low FROM products WHERE id = $1", uuid.UUID(pid)) is True


async def test_concurrent_releases_and_reservations_keep_the_flag_true_to_the_stock(stub, cp_pool):
    """Reservations, releases and imports racing around the threshold: afterwards the flag says what
    the stock is, and the events alternate with re-arms (never two announcements in a row without
    the stock having risen above the threshold in between)."""
    pid = await product(stub, 5, stock=12)
    svc = ReservationService(cp_pool, ttl_seconds=60)
    held = [await reserve(stub, pid, 1) for _ in range(6)]       # 6 left: armed
    await asyncio.gather(*(reserve(stub, pid, 1) for _ in range(4)),
                         *(svc.release(r.order_id, "system") for r in held))
    await StockEvents(cp_pool).recheck()
    available, _, _ = await stock_of(stub, pid)
    low = await cp_pool.fetchval("SELECT stock_low FROM products WHERE id = $1", uuid.UUID(pid))
    assert low == (available <= 5)
    evs = await events(cp_pool, pid)
    assert all(e["data"]["product"]["available"] <= 5 for e in evs)


async def test_a_rolled_back_or_killed_change_leaves_no_event(stub, cp_pool, codepool_dsn):
    pid = await product(stub, 3, stock=5)
    # short stock: RESERVE raises and undoes everything, the flag and the event included
    with pytest.raises(grpc.aio.AioRpcError):
        await reserve(stub, pid, 6)
    assert await events(cp_pool, pid) == [] and await stock_of(stub, pid) == (5, 0, 0)
    # the crossing statement ran (event row written, flag set) but the transaction is killed
    # before its commit: a crash of the code pool at the worst moment
    conn = await asyncpg.connect(codepool_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("UPDATE codes SET status = 'reserved' WHERE id IN (SELECT id FROM codes WHERE "
                           "product_id = $1 AND status = 'available' ORDER BY seq LIMIT 2)", uuid.UUID(pid))
        assert await conn.fetchval("SELECT count(*) FROM stock_events WHERE product_id = $1", uuid.UUID(pid)) == 1
        pid_backend = await conn.fetchval("SELECT pg_backend_pid()")
        await cp_pool.execute("SELECT pg_terminate_backend($1)", pid_backend)
    finally:
        conn.terminate()
    assert await events(cp_pool, pid) == [] and await stock_of(stub, pid) == (5, 0, 0)
    assert await cp_pool.fetchval("SELECT stock_low FROM products WHERE id = $1", uuid.UUID(pid)) is False
    # and the same change committed: the stock and its event together
    await reserve(stub, pid, 2)
    assert len(await events(cp_pool, pid)) == 1
    # the outbox is history
    with pytest.raises(asyncpg.PostgresError):
        await cp_pool.execute("DELETE FROM stock_events WHERE product_id = $1", uuid.UUID(pid))


async def test_a_late_delivery_re_taking_codes_is_a_crossing_too(stub, cp_pool):
    pid = await product(stub, 1, stock=3)
    svc = ReservationService(cp_pool, ttl_seconds=60)
    r = await reserve(stub, pid, 2)                    # 1 left: event 1
    await svc.release(r.order_id, "system")            # 3: re-armed
    await svc.deliver(r.order_id, "tx-" + new_id(), "system")   # the late payment takes 2 again: event 2
    assert [e["data"]["product"]["available"] for e in await events(cp_pool, pid)] == [1, 1]


async def test_list_stock_events_is_a_cursor_feed_for_the_system_only(stub, cp_pool):
    pid = await product(stub, 1, stock=2)
    await reserve(stub, pid, 1)
    seq = await cp_pool.fetchval("SELECT seq FROM stock_events WHERE product_id = $1", uuid.UUID(pid))
    page = await stub.ListStockEvents(pb.ListStockEventsRequest(after_seq=seq - 1, page_size=500))
    ev = page.events[0]
    assert (ev.seq, ev.type, ev.merchant_id) == (seq, "stock.low", "merchant-test")
    assert json.loads(ev.payload_json)["id"] == ev.id
    assert all(e.seq > seq for e in (await stub.ListStockEvents(pb.ListStockEventsRequest(after_seq=seq))).events)
    seqs = [e.seq for e in (await stub.ListStockEvents(pb.ListStockEventsRequest(after_seq=0, page_size=3))).events]
    assert seqs == sorted(seqs) and len(seqs) <= 3
    for md in (STAFF, ADMIN):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.ListStockEvents(pb.ListStockEventsRequest(), metadata=md)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ListStockEvents(pb.ListStockEventsRequest(after_seq=-1))
    assert bad_field(e.value) == "after_seq"


async def test_the_recheck_announces_a_crossing_the_fast_path_missed_and_re_arms_a_stale_flag(stub, cp_pool):
    """What a race on the lock-free fast path can leave (both racers saw "above"): the flag armed while
    the stock is low, or set while it is high. The recheck re-decides both, once."""
    rechecks = StockEvents(cp_pool)
    await rechecks.recheck()  # whatever earlier tests left
    low_pid = await product(stub, 5, stock=8)
    await reserve(stub, low_pid, 4)  # 4 left: announced by the statement
    assert len(await events(cp_pool, low_pid)) == 1
    high_pid = await product(stub, 5, stock=8)  # armed, 8 available
    # The states a race leaves, written by hand (a products update fires no stock trigger): the flag
    # wrong, and the counter rows the racing statements changed marked for the next round.
    await cp_pool.execute("UPDATE products SET stock_low = NOT stock_low WHERE id = ANY($1::uuid[])",
                          [uuid.UUID(low_pid), uuid.UUID(high_pid)])
    await cp_pool.execute("UPDATE product_stock SET dirty = true WHERE product_id = ANY($1::uuid[])",
                          [uuid.UUID(low_pid), uuid.UUID(high_pid)])
    assert await rechecks.recheck() == 2
    assert len(await events(cp_pool, low_pid)) == 2  # announced again: the flag said it was not
    assert await events(cp_pool, high_pid) == []  # re-armed, nothing to announce
    flags = dict(await cp_pool.fetch("SELECT id::text, stock_low FROM products WHERE id = ANY($1::uuid[])",
                                     [uuid.UUID(low_pid), uuid.UUID(high_pid)]))
    assert flags == {low_pid: True, high_pid: False}
    assert await rechecks.recheck() == 0
    # The fast path itself: far above the threshold, reservations change nothing but the stock.
    await reserve(stub, high_pid, 2)
    assert await events(cp_pool, high_pid) == [] and await rechecks.recheck() == 0
