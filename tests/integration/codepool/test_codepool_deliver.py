"""DeliverCodes (idempotent on the payment transaction), ReleaseReservation, late payments."""
import asyncio

import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.testing.ids import new_id

from codepool_testkit import reserve_request, stock_of, stocked_product


def deliver(order_id: str, ptx: str | None = None) -> pb.DeliverCodesRequest:
    return pb.DeliverCodesRequest(order_id=order_id, payment_transaction_id=ptx or "ptx-" + new_id())


async def test_deliver_then_repeated_callback_returns_the_same_delivery(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 5)
    res = await stub.ReserveCodes(reserve_request(product_id, 2))
    req = deliver(res.order_id)
    first = await stub.DeliverCodes(req)
    assert first.status == pb.RESERVATION_STATUS_DELIVERED
    assert first.payment_transaction_id == req.payment_transaction_id
    assert list(first.code_ids) == list(res.code_ids)
    again = await stub.DeliverCodes(req)
    assert again == first
    assert await stock_of(stub, product_id) == (3, 0, 2)
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE order_id = $1 AND action = 'deliver'",
                                  res.order_id) == 1
    assert await cp_pool.fetchval("SELECT outcome FROM payment_transactions WHERE transaction_id = $1",
                                  req.payment_transaction_id) == "delivered"


async def test_concurrent_duplicate_callbacks_have_one_effect(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 6)
    res = await stub.ReserveCodes(reserve_request(product_id, 3))
    req = deliver(res.order_id)
    results = await asyncio.gather(*(stub.DeliverCodes(req) for _ in range(20)))
    assert all(r == results[0] for r in results)
    assert results[0].status == pb.RESERVATION_STATUS_DELIVERED
    assert await stock_of(stub, product_id) == (3, 0, 3)
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE order_id = $1 AND action = 'deliver'",
                                  res.order_id) == 1
    assert await cp_pool.fetchval("SELECT count(*) FROM deliveries WHERE order_id = $1 AND status = 'delivered'",
                                  res.order_id) == 3


async def test_second_payment_for_a_delivered_order_is_refused_every_time(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 3)
    res = await stub.ReserveCodes(reserve_request(product_id, 1))
    await stub.DeliverCodes(deliver(res.order_id))
    second = deliver(res.order_id)
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.DeliverCodes(second)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(e.value) == "order-already-delivered"
    assert await stock_of(stub, product_id) == (2, 0, 1)
    assert await cp_pool.fetchval("SELECT outcome FROM payment_transactions WHERE transaction_id = $1",
                                  second.payment_transaction_id) == "rejected"


async def test_transaction_of_another_order_is_refused(stub):
    product_id, _ = await stocked_product(stub, 3)
    a = await stub.ReserveCodes(reserve_request(product_id, 1))
    b = await stub.ReserveCodes(reserve_request(product_id, 1))
    req = deliver(a.order_id)
    await stub.DeliverCodes(req)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.DeliverCodes(deliver(b.order_id, req.payment_transaction_id))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(e.value) == "transaction-order-mismatch"
    assert await stock_of(stub, product_id) == (1, 1, 1)


async def test_release_is_idempotent_and_refused_after_delivery(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 4)
    res = await stub.ReserveCodes(reserve_request(product_id, 2))
    rel = pb.ReleaseReservationRequest(order_id=res.order_id)
    first = await stub.ReleaseReservation(rel)
    assert first.status == pb.RESERVATION_STATUS_RELEASED and not first.code_ids
    assert await stub.ReleaseReservation(rel) == first
    assert await stock_of(stub, product_id) == (4, 0, 0)
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE order_id = $1 AND action = 'release'",
                                  res.order_id) == 1
    # replaying the reservation after a release does not take stock again
    replay = await stub.ReserveCodes(reserve_request(product_id, 2, order_id=res.order_id, customer_id=res.customer_id))
    assert replay.status == pb.RESERVATION_STATUS_RELEASED
    assert await stock_of(stub, product_id) == (4, 0, 0)

    res2 = await stub.ReserveCodes(reserve_request(product_id, 1))
    await stub.DeliverCodes(deliver(res2.order_id))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=res2.order_id))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_release_racing_delivery_never_loses_the_paid_order(stub):
    """Whichever lands first, the paid order ends delivered with its codes: a release that wins is
    followed by the payment re-reserving (stock allows here); a delivery that wins refuses the release."""
    product_id, _ = await stocked_product(stub, 40)
    release_won = deliver_won = 0
    for _ in range(10):
        res = await stub.ReserveCodes(reserve_request(product_id, 2))
        d, r = await asyncio.gather(stub.DeliverCodes(deliver(res.order_id)),
                                    stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=res.order_id)),
                                    return_exceptions=True)
        assert isinstance(d, pb.Reservation) and d.status == pb.RESERVATION_STATUS_DELIVERED and len(d.code_ids) == 2
        if isinstance(r, pb.Reservation):
            assert r.status == pb.RESERVATION_STATUS_RELEASED
            release_won += 1
        else:
            assert r.code() == grpc.StatusCode.FAILED_PRECONDITION
            deliver_won += 1
    assert release_won + deliver_won == 10
    assert await stock_of(stub, product_id) == (20, 0, 20)


async def test_payment_after_expiry_re_reserves_when_stock_allows(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 3)
    res = await stub.ReserveCodes(reserve_request(product_id, 2))
    await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=res.order_id))
    got = await stub.DeliverCodes(deliver(res.order_id))
    assert got.status == pb.RESERVATION_STATUS_DELIVERED and len(got.code_ids) == 2
    assert await stock_of(stub, product_id) == (1, 0, 2)
    actions = [r["action"] for r in await cp_pool.fetch(
        "SELECT action FROM audit_log WHERE order_id = $1 ORDER BY id", res.order_id)]
    assert actions == ["reserve", "release", "reserve", "deliver"]


async def test_payment_after_expiry_without_stock_fails_and_stays_failed(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 2)
    res = await stub.ReserveCodes(reserve_request(product_id, 2))
    await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=res.order_id))
    taker = await stub.ReserveCodes(reserve_request(product_id, 1))  # someone took one of the codes meanwhile
    req = deliver(res.order_id)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.DeliverCodes(req)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(e.value) == "reservation-lost"
    assert "only 1 codes are available for the 2 ordered" in e.value.details()
    assert await stock_of(stub, product_id) == (1, 1, 0)  # the partial re-reserve left nothing behind
    # stock comes back, but the refused callback stays refused: the orchestrator is refunding it
    await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=taker.order_id))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.DeliverCodes(req)
    assert error_reason(e.value) == "reservation-lost"
    assert await stock_of(stub, product_id) == (2, 0, 0)
    status = await cp_pool.fetchval("SELECT status FROM reservations WHERE order_id = $1", res.order_id)
    assert status == "released"


@pytest.mark.parametrize("req, field, code", [
    (pb.DeliverCodesRequest(order_id="", payment_transaction_id="p"), "order_id", grpc.StatusCode.INVALID_ARGUMENT),
    (pb.DeliverCodesRequest(order_id="o", payment_transaction_id=""), "payment_transaction_id",
     grpc.StatusCode.INVALID_ARGUMENT),
    (pb.DeliverCodesRequest(order_id="o", payment_transaction_id="p" * 257), "payment_transaction_id",
     grpc.StatusCode.INVALID_ARGUMENT),
    (pb.DeliverCodesRequest(order_id="no-such-order", payment_transaction_id="p"), "", grpc.StatusCode.NOT_FOUND),
])
async def test_bad_deliver_input(stub, req, field, code):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.DeliverCodes(req)
    assert e.value.code() == code
    assert bad_field(e.value) == field


async def test_unknown_order_release_and_codes_are_not_found(stub):
    for call in (stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id="ord-" + new_id())),
                 stub.GetDeliveredCodes(pb.GetDeliveredCodesRequest(order_id="ord-" + new_id(), customer_id="c"))):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
