"""ReserveCodes: all or nothing, SKIP LOCKED under concurrency, idempotent on the order item."""
import asyncio

import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from cutylib.grpc_errors import bad_field, error_reason, unpack_detail
from cutylib.testing.ids import new_id

from codepool_testkit import customer, new_product, reserve_request, stock_of, stocked_product


async def test_reserve_takes_codes_and_replay_returns_the_same(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 10)
    req = reserve_request(product_id, 3)
    first = await stub.ReserveCodes(req)
    assert first.status == pb.RESERVATION_STATUS_RESERVED
    assert len(first.code_ids) == 3 and first.quantity == 3
    assert first.unit_price.amount_minor == 1999 and first.unit_price.currency_code == "TRY"
    assert first.expire_time.ToDatetime() > first.reserve_time.ToDatetime()
    again = await stub.ReserveCodes(req)
    assert list(again.code_ids) == list(first.code_ids)
    assert await stock_of(stub, product_id) == (7, 3, 0)
    rows = await cp_pool.fetch("SELECT code_id, status, customer_id FROM deliveries WHERE order_id = $1", req.order_id)
    assert sorted(str(r["code_id"]) for r in rows) == sorted(first.code_ids)
    assert {(r["status"], r["customer_id"]) for r in rows} == {("reserved", req.customer_id)}
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE order_id = $1 AND action = 'reserve'",
                                  req.order_id) == 1


async def test_same_order_with_other_parameters_is_refused(stub):
    product_id, _ = await stocked_product(stub, 5)
    req = reserve_request(product_id, 1)
    await stub.ReserveCodes(req)
    other = pb.ReserveCodesRequest()
    other.CopyFrom(req)
    other.quantity = 2
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(other)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(e.value) == "reservation-mismatch"
    other.CopyFrom(req)
    other.order_id = "ord-" + new_id()  # a new order reusing the item id
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(other)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await stock_of(stub, product_id) == (4, 1, 0)


async def test_short_stock_is_resource_exhausted_and_reserves_nothing(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 4)
    await stub.ReserveCodes(reserve_request(product_id, 2))
    req = reserve_request(product_id, 3)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(req)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_reason(e.value) == "out-of-stock"
    detail = unpack_detail(e.value, pb.OutOfStock)
    assert (detail.product_id, detail.requested, detail.available) == (product_id, 3, 2)
    assert await stock_of(stub, product_id) == (2, 2, 0)
    assert await cp_pool.fetchval("SELECT count(*) FROM reservations WHERE order_id = $1", req.order_id) == 0
    assert await cp_pool.fetchval("SELECT count(*) FROM deliveries WHERE order_id = $1", req.order_id) == 0
    # nothing of the refused attempt stays behind: the same order can reserve what there is
    await stub.ReserveCodes(reserve_request(product_id, 2, order_id=req.order_id, customer_id=req.customer_id))
    assert await stock_of(stub, product_id) == (0, 4, 0)


async def test_concurrent_buyers_split_the_stock_without_overlap(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 100)
    reqs = [reserve_request(product_id, 3) for _ in range(50)]
    results = await asyncio.gather(*(stub.ReserveCodes(r) for r in reqs), return_exceptions=True)
    ok = [r for r in results if isinstance(r, pb.Reservation)]
    failed = [r for r in results if not isinstance(r, pb.Reservation)]
    assert len(ok) == 33
    assert all(f.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for f in failed)
    taken = [c for r in ok for c in r.code_ids]
    assert len(taken) == len(set(taken)) == 99
    assert await stock_of(stub, product_id) == (1, 99, 0)
    # the database agrees with what the clients saw
    rows = await cp_pool.fetch("SELECT order_id, code_id FROM deliveries WHERE product_id = $1 AND status = 'reserved'",
                               product_id)
    assert sorted(str(r["code_id"]) for r in rows) == sorted(taken)


async def test_concurrent_replays_of_one_item_reserve_once(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 20)
    req = reserve_request(product_id, 2)
    results = await asyncio.gather(*(stub.ReserveCodes(req) for _ in range(10)))
    assert len({tuple(r.code_ids) for r in results}) == 1
    assert await stock_of(stub, product_id) == (18, 2, 0)
    assert await cp_pool.fetchval("SELECT count(*) FROM deliveries WHERE order_id = $1", req.order_id) == 2


@pytest.mark.parametrize("change, field", [
    ({"quantity": 0}, "quantity"),
    ({"quantity": 101}, "quantity"),
    ({"quantity": -1}, "quantity"),
    ({"product_id": "not-a-uuid"}, "product_id"),
    ({"product_id": "00000000-0000-0000-0000-000000000000"}, "product_id"),
    ({"order_id": ""}, "order_id"),
    ({"order_item_id": ""}, "order_item_id"),
    ({"order_id": "x" * 129}, "order_id"),
    ({"customer_id": ""}, "customer_id"),
])
async def test_bad_reserve_input_names_the_field(stub, change, field):
    product_id, _ = await stocked_product(stub, 3)
    req = reserve_request(product_id, 1)
    for k, v in change.items():
        setattr(req, k, v)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == field
    assert await stock_of(stub, product_id) == (3, 0, 0)


async def test_no_user_reserves_reads_delivers_or_releases_codes(stub):
    """Reservations are the orchestrator's alone: only the gateway brings users, and it has no
    route to them, so a customer's own call is refused, even on its own order (it could otherwise
    deliver its reserved codes with a made-up payment)."""
    product_id, _ = await stocked_product(stub, 3)
    alice, bob = "alice-" + new_id(), "bob-" + new_id()
    req = reserve_request(product_id, 1, customer_id=alice)
    await stub.ReserveCodes(req)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(reserve_request(product_id, 1, customer_id=""), metadata=customer(alice))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    for who in (bob, alice):
        for call in (stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=req.order_id), metadata=customer(who)),
                     stub.DeliverCodes(pb.DeliverCodesRequest(order_id=req.order_id, payment_transaction_id="free"),
                                       metadata=customer(who))):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_known_product_without_codes_is_out_of_stock(stub):
    product_id = await new_product(stub)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(reserve_request(product_id, 1))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert unpack_detail(e.value, pb.OutOfStock).available == 0
