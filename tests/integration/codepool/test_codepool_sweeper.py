"""Reservations past CUTY_CODE_RESERVATION_TTL_SECONDS go back to stock, once, with any number of sweepers."""
import asyncio
import uuid

from cuty.codepool.v1 import codepool_pb2 as pb, codepool_pb2_grpc
from codepool.grpc_api import CALLERS
from cutylib.testing.trust import acting_channel
from cutylib.testing.procs import wait_for

from codepool.bootstrap import create_server
from codepool.domain import ReserveCommand
from codepool.service import ReservationService
from codepool_testkit import reserve_request, settings, stock_of, stocked_product


async def _reserve(service: ReservationService, product_id: str, quantity: int) -> str:
    """Reserve through the use case directly (a TTL of 0 makes the reservation due at once)."""
    r = reserve_request(product_id, quantity)
    await service.reserve(ReserveCommand(r.order_id, r.order_item_id, uuid.UUID(product_id), quantity, "c"), "system")
    return r.order_id


async def test_sweeper_releases_expired_reservations(cp_pool, keyring, stub):
    server = await create_server(settings(code_reservation_ttl_seconds=1, sweep_interval_seconds=0.1), cp_pool,
                                 keyring=keyring)
    await server.start()
    try:
        async with acting_channel(f"127.0.0.1:{server.port}", "codepool", CALLERS) as ch:
            short = codepool_pb2_grpc.CodePoolServiceStub(ch)
            product_id, _ = await stocked_product(stub, 5)
            res = await short.ReserveCodes(reserve_request(product_id, 3))
            assert await stock_of(stub, product_id) == (2, 3, 0)

            async def released():
                return await cp_pool.fetchval("SELECT status FROM reservations WHERE order_id = $1",
                                              res.order_id) == "released"

            await wait_for(released, timeout=10, message="the reservation to expire")
            assert await stock_of(stub, product_id) == (5, 0, 0)
            row = await cp_pool.fetchrow("SELECT release_reason, released_at >= expires_at AS late FROM reservations "
                                         "WHERE order_id = $1", res.order_id)
            assert row["release_reason"] == "expired" and row["late"]
            audit = await cp_pool.fetchrow("SELECT actor, code_ids FROM audit_log WHERE order_id = $1 AND action = 'expire'",
                                           res.order_id)
            assert audit["actor"] == "system:sweeper"
            assert sorted(str(c) for c in audit["code_ids"]) == sorted(res.code_ids)
            assert server.sweeper.expired_total >= 1
    finally:
        await server.stop()


async def test_concurrent_sweepers_expire_each_reservation_once(cp_pool, stub):
    product_id, _ = await stocked_product(stub, 60)
    quick = ReservationService(cp_pool, ttl_seconds=0)
    orders = [await _reserve(quick, product_id, 2) for _ in range(30)]

    async def all_released():
        # every replica sweeps at once, in small batches
        await asyncio.gather(*(quick.expire_due(4) for _ in range(12)))
        return await cp_pool.fetchval("SELECT count(*) = 0 FROM reservations WHERE order_id = ANY($1) "
                                      "AND status = 'reserved'", orders)

    await wait_for(all_released, timeout=10, interval=0, message="all reservations to expire")
    per_order = await cp_pool.fetch("SELECT order_id, count(*) AS n FROM audit_log WHERE action = 'expire' "
                                    "AND order_id = ANY($1) GROUP BY order_id", orders)
    assert len(per_order) == 30 and {r["n"] for r in per_order} == {1}
    assert await stock_of(stub, product_id) == (60, 0, 0)


async def test_expired_but_unswept_reservation_is_still_delivered(cp_pool, stub):
    """The codes are still this order's until a sweeper gives them back: a payment arriving in
    between delivers them (the buyer paid; nobody else could have them)."""
    product_id, _ = await stocked_product(stub, 2)
    order_id = await _reserve(ReservationService(cp_pool, ttl_seconds=0), product_id, 1)
    got = await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=order_id, payment_transaction_id="p-" + order_id))
    assert got.status == pb.RESERVATION_STATUS_DELIVERED
    assert await stock_of(stub, product_id) == (1, 0, 1)
