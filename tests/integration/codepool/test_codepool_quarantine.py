"""Supplier batch quarantine (docs/codepool.md, "Batch quarantine"), against the real database: claims
racing past a product's threshold quarantine the batch once, in one statement; reservations made
before are honoured; a code released from a held-back batch never sells again; release and retire."""
from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
import pytest_asyncio

from cuty.codepool.v1 import claims_pb2 as cpb, claims_pb2_grpc, codepool_pb2 as pb
from cutylib.grpc_errors import error_reason
from cutylib.testing.ids import new_id
from cutylib.testing.trust import acting_channel, user

from codepool import claims_api
from codepool_testkit import ADMIN, STAFF, customer, make_codes, new_product, reserve_request


@pytest_asyncio.fixture(scope="module")
async def claims_channel(cp_server):
    async with acting_channel(f"127.0.0.1:{cp_server.port}", "codepool", claims_api.CALLERS,
                              deadline_seconds=30) as ch:
        yield ch


@pytest.fixture
def claims(claims_channel) -> claims_pb2_grpc.CodeClaimServiceStub:
    return claims_pb2_grpc.CodeClaimServiceStub(claims_channel)


async def stocked(stub, claims, n: int, threshold: int) -> tuple[str, str]:
    product_id = await new_product(stub)
    r = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b-" + new_id(),
                                                             codes=make_codes(n)), metadata=ADMIN)
    p = await claims.SetClaimThreshold(cpb.SetClaimThresholdRequest(product_id=product_id,
                                                                    claim_quarantine_threshold=threshold), metadata=ADMIN)
    assert p.claim_quarantine_threshold == threshold
    return product_id, r.batch_id


async def delivered(stub, product_id: str):
    buyer = "cust-" + new_id()
    res = await stub.ReserveCodes(reserve_request(product_id, 1, customer_id=buyer))
    await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=res.order_id, payment_transaction_id="p-" + new_id()))
    return res.order_id, res.code_ids[0], buyer


async def claim(claims, order_id, code_id, buyer):
    return await claims.OpenCodeClaim(cpb.OpenCodeClaimRequest(
        checkout_id=order_id, code_id=code_id, kind=cpb.CLAIM_KIND_DOES_NOT_WORK, reason="invalid"),
        metadata=customer(buyer) + (("idempotency-key", uuid.uuid4().hex),))


async def stock(stub, product_id):
    return await stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=STAFF)


async def test_claims_racing_past_the_threshold_quarantine_the_batch_once(stub, claims, cp_pool):
    product_id, batch_id = await stocked(stub, claims, 30, threshold=3)
    sold = [await delivered(stub, product_id) for _ in range(8)]
    pending = await stub.ReserveCodes(reserve_request(product_id, 2))  # reserved before the quarantine
    await asyncio.gather(*(claim(claims, *s) for s in sold))
    (batch,) = (await claims.ListBatches(cpb.ListBatchesRequest(product_id=product_id), metadata=STAFF)).batches
    assert batch.status == cpb.BATCH_STATUS_QUARANTINED and batch.counted_claims == 8
    s = await stock(stub, product_id)
    assert (s.available, s.reserved, s.delivered, s.quarantined) == (0, 2, 8, 20)
    events = await cp_pool.fetch("SELECT payload FROM stock_events WHERE product_id = $1 AND type = 'batch.quarantined'",
                                 uuid.UUID(product_id))
    assert len(events) == 1 and events[0]["payload"]["data"]["batch"]["codes_quarantined"] == 20
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE product_id = $1 AND action = 'batch_quarantine'",
                                  uuid.UUID(product_id)) == 1
    # nothing more sells; the reservation made before is honoured when paid
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ReserveCodes(reserve_request(product_id, 1))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    paid = await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=pending.order_id, payment_transaction_id="p-1" + new_id()))
    assert paid.status == pb.RESERVATION_STATUS_DELIVERED


async def test_a_code_released_from_a_held_back_batch_is_not_sold_again(stub, claims, cp_pool):
    product_id, batch_id = await stocked(stub, claims, 10, threshold=1)
    order_id, code_id, buyer = await delivered(stub, product_id)
    held = await stub.ReserveCodes(reserve_request(product_id, 2))
    await claim(claims, order_id, code_id, buyer)  # threshold 1: quarantined at once
    await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=held.order_id))
    statuses = {r["status"] for r in await cp_pool.fetch("SELECT status FROM codes WHERE id = ANY($1::uuid[])",
                                                         [uuid.UUID(c) for c in held.code_ids])}
    assert statuses == {"quarantined"}
    s = await stock(stub, product_id)
    assert (s.available, s.quarantined) == (0, 9)
    # released: the batch sells again, and its claims so far no longer count
    released = await claims.ReleaseBatch(cpb.BatchDecisionRequest(product_id=product_id, batch_id=batch_id,
                                                                  note="supplier checked"), metadata=ADMIN)
    assert released.status == cpb.BATCH_STATUS_ACTIVE and released.codes_moved == 9 and released.counted_claims == 0
    assert (await stock(stub, product_id)).available == 9
    # quarantined again by the next claim, then retired: its codes are revoked, for good
    again = await delivered(stub, product_id)
    held = await stub.ReserveCodes(reserve_request(product_id, 1))
    await claim(claims, *again)
    retired = await claims.RetireBatch(cpb.BatchDecisionRequest(product_id=product_id, batch_id=batch_id),
                                       metadata=ADMIN)
    assert retired.status == cpb.BATCH_STATUS_RETIRED and retired.codes_moved == 7
    await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=held.order_id))
    s = await stock(stub, product_id)
    assert (s.available, s.reserved, s.quarantined, s.revoked, s.delivered) == (0, 0, 0, 8, 2)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.ReleaseBatch(cpb.BatchDecisionRequest(product_id=product_id, batch_id=batch_id), metadata=ADMIN)
    assert error_reason(e.value) == "batch-not-quarantined"
    # a batch of another merchant's product does not exist for its staff
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.ListBatches(cpb.ListBatchesRequest(product_id=product_id), metadata=user("s", "staff", "m-other"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_claim_export_lists_codes_orders_and_claims_and_is_audited(stub, claims, cp_pool):
    product_id, batch_id = await stocked(stub, claims, 6, threshold=100)
    sold = [await delivered(stub, product_id) for _ in range(2)]
    for s in sold:
        await claim(claims, *s)
    out = await claims.ExportBatchClaims(cpb.ExportBatchClaimsRequest(product_id=product_id, batch_id=batch_id),
                                         metadata=ADMIN)
    lines = out.csv.splitlines()
    assert lines[0].startswith("claim_id,claim_status,kind,reason,opened_at") and out.rows == 2 and len(lines) == 3
    assert {line.split(",")[11] for line in lines[1:]} == {o for o, _, _ in sold}
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE product_id = $1 AND action = 'claims_export'",
                                  uuid.UUID(product_id)) == 1
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.ExportBatchClaims(cpb.ExportBatchClaimsRequest(product_id=product_id, batch_id=batch_id),
                                       metadata=STAFF)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
