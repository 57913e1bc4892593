"""One customer cannot reserve a product's whole stock. At most
CUTY_MAX_ACTIVE_RESERVATIONS live reservations and CUTY_MAX_QUANTITY_PER_PRODUCT codes of one
product per customer, decided by the database under real concurrency."""
import asyncio

import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from cutylib.config import Settings
from cutylib.grpc_errors import error_reason
from cutylib.testing.ids import new_id

from codepool_testkit import reserve_request, stock_of, stocked_product

MAX_ACTIVE = Settings().max_active_reservations
MAX_QUANTITY = Settings().max_quantity_per_product


async def _live(cp_pool, customer_id: str) -> list:
    return await cp_pool.fetch("SELECT order_id, quantity FROM reservations WHERE customer_id = $1 "
                               "AND status = 'reserved'", customer_id)


async def test_defaults_are_documented_values():
    assert (MAX_ACTIVE, MAX_QUANTITY) == (3, 10)


async def test_concurrent_reserves_of_one_customer_stop_at_the_cap(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 50)
    hoarder = "hoarder-" + new_id()
    results = await asyncio.gather(*(stub.ReserveCodes(reserve_request(product_id, 1, customer_id=hoarder))
                                     for _ in range(20)), return_exceptions=True)
    won = [r for r in results if isinstance(r, pb.Reservation)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(won) == MAX_ACTIVE and len(refused) == 20 - MAX_ACTIVE
    assert {(e.code(), error_reason(e)) for e in refused} == {
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "too-many-active-reservations")}
    assert len(await _live(cp_pool, hoarder)) == MAX_ACTIVE
    assert await stock_of(stub, product_id) == (50 - MAX_ACTIVE, MAX_ACTIVE, 0)
    # Another customer is not affected.
    await stub.ReserveCodes(reserve_request(product_id, 1))


async def test_quantity_per_product_is_capped_across_reservations(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 40)
    buyer = "bulk-" + new_id()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(reserve_request(product_id, MAX_QUANTITY + 1, customer_id=buyer))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(e.value) == "quantity-limit"
    await stub.ReserveCodes(reserve_request(product_id, MAX_QUANTITY - 2, customer_id=buyer))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(reserve_request(product_id, 3, customer_id=buyer))
    assert error_reason(e.value) == "quantity-limit"
    await stub.ReserveCodes(reserve_request(product_id, 2, customer_id=buyer))
    assert sum(r["quantity"] for r in await _live(cp_pool, buyer)) == MAX_QUANTITY
    # Another product of the same customer has its own allowance.
    other, _ = await stocked_product(stub, 5)
    await stub.ReserveCodes(reserve_request(other, 1, customer_id=buyer))


async def test_released_or_expired_reservations_free_the_cap_and_replays_are_not_capped(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 20)
    buyer = "cust-" + new_id()
    reqs = [reserve_request(product_id, 1, customer_id=buyer) for _ in range(MAX_ACTIVE)]
    for req in reqs:
        await stub.ReserveCodes(req)
    again = await stub.ReserveCodes(reqs[0])  # a replay at the cap answers the stored reservation
    assert again.order_id == reqs[0].order_id
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.ReserveCodes(reserve_request(product_id, 1, customer_id=buyer))
    await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=reqs[0].order_id))
    await stub.ReserveCodes(reserve_request(product_id, 1, customer_id=buyer))
    # Past its expiry (not yet swept) a reservation no longer counts.
    await cp_pool.execute("UPDATE reservations SET expires_at = clock_timestamp() - interval '1 second' "
                          "WHERE order_id = $1", reqs[1].order_id)
    await stub.ReserveCodes(reserve_request(product_id, 1, customer_id=buyer))
    assert len(await _live(cp_pool, buyer)) == MAX_ACTIVE + 1  # one of them past its expiry
