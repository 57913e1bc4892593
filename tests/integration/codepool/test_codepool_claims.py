"""Claims on delivered codes and their resolution (docs/codepool.md, "Claims, replacement and batch
quarantine"), against the real database and the in-process server: who may open one, replays, one
unresolved claim per code, replacement decided by the database under concurrency, refunds' steps,
and what the buyer sees afterwards."""
from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
import pytest_asyncio

from cuty.codepool.v1 import claims_pb2 as cpb, claims_pb2_grpc, codepool_pb2 as pb
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.testing.ids import new_id
from cutylib.testing.trust import acting_channel, user

from codepool import claims_api
from codepool_testkit import ADMIN, STAFF, customer, make_codes, new_product, reserve_request

DOES_NOT_WORK = cpb.CLAIM_KIND_DOES_NOT_WORK


@pytest_asyncio.fixture(scope="module")
async def claims_channel(cp_server):
    async with acting_channel(f"127.0.0.1:{cp_server.port}", "codepool", claims_api.CALLERS,
                              deadline_seconds=30) as ch:
        yield ch


@pytest.fixture
def claims(claims_channel) -> claims_pb2_grpc.CodeClaimServiceStub:
    return claims_pb2_grpc.CodeClaimServiceStub(claims_channel)


async def import_batch(stub, product_id: str, n: int) -> str:
    r = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b-" + new_id(),
                                                             codes=make_codes(n)), metadata=ADMIN)
    assert r.accepted
    return r.batch_id


async def bought(stub, product_id: str, quantity: int = 1, buyer: str | None = None):
    """A delivered order of `buyer`: (order id, its code ids, the buyer)."""
    buyer = buyer or "cust-" + new_id()
    res = await stub.ReserveCodes(reserve_request(product_id, quantity, customer_id=buyer))
    done = await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=res.order_id, payment_transaction_id="ptx-" + new_id()))
    return done.order_id, list(done.code_ids), buyer


def key(k: str | None = None):
    return (("idempotency-key", k or uuid.uuid4().hex),)


async def open_claim(claims, order_id: str, code_id: str, who, *, k: str | None = None, reason: str = "not accepted"):
    return await claims.OpenCodeClaim(cpb.OpenCodeClaimRequest(checkout_id=order_id, code_id=code_id, kind=DOES_NOT_WORK,
                                                               reason=reason), metadata=who + key(k))


def settle(claim_id: str, step, note: str = "", refund_id: str = "") -> cpb.SettleCodeClaimRequest:
    return cpb.SettleCodeClaimRequest(claim_id=claim_id, step=step, note=note, refund_id=refund_id, actor="admin:a1")


async def stock(stub, product_id: str) -> pb.Stock:
    return await stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=STAFF)


async def test_a_buyer_opens_a_claim_once_and_nobody_else_can(stub, claims, cp_pool):
    product_id = await new_product(stub)
    await import_batch(stub, product_id, 4)
    order_id, (code, other_code), buyer = await bought(stub, product_id, 2)
    k = uuid.uuid4().hex
    first = await open_claim(claims, order_id, code, customer(buyer), k=k)
    assert first.status == cpb.CLAIM_STATUS_OPEN and first.checkout_id == order_id and first.code_id == code
    assert first.customer_id == buyer and first.opened_by == f"customer:{buyer}"
    # the same key answers the same claim; with another body it is refused
    assert await open_claim(claims, order_id, code, customer(buyer), k=k) == first
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await open_claim(claims, order_id, code, customer(buyer), k=k, reason="something else")
    assert error_reason(e.value) == "idempotency-key-reused"
    # one unresolved claim per code, whoever opens the second
    for who in (customer(buyer), STAFF):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await open_claim(claims, order_id, code, who)
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS and error_reason(e.value) == "claim-open"
    # another customer, another merchant's staff: no such code (existence is not leaked)
    for who in (customer("cust-" + new_id()), user("staff-x", "staff", "merchant-other-" + new_id()[:6])):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await open_claim(claims, order_id, other_code, who)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # the merchant's staff may open one on the other code
    staffs = await open_claim(claims, order_id, other_code, STAFF)
    assert staffs.opened_by.startswith("staff:")
    # bad input names its field and writes nothing
    for req, field in ((cpb.OpenCodeClaimRequest(checkout_id=order_id, code_id=code, kind=0, reason="x"), "kind"),
                       (cpb.OpenCodeClaimRequest(checkout_id=order_id, code_id=code, kind=DOES_NOT_WORK, reason=" "),
                        "reason"),
                       (cpb.OpenCodeClaimRequest(checkout_id=order_id, code_id="nope", kind=DOES_NOT_WORK, reason="x"),
                        "code_id")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await claims.OpenCodeClaim(req, metadata=customer(buyer) + key())
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == field
    assert await cp_pool.fetchval("SELECT count(*) FROM code_claims WHERE order_id = $1", order_id) == 2
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE order_id = $1 AND action = 'claim_open'",
                                  order_id) == 2
    events = await cp_pool.fetch("SELECT type, order_id, payload FROM stock_events WHERE order_id = $1 ORDER BY seq",
                                 order_id)
    assert [e["type"] for e in events] == ["code.claimed", "code.claimed"]
    assert events[0]["payload"]["data"]["claim"]["id"] == first.id
    # the buyer and the merchant's staff read it; another customer does not
    assert (await claims.GetCodeClaim(cpb.GetCodeClaimRequest(claim_id=first.id), metadata=customer(buyer))) == first
    assert (await claims.GetCodeClaim(cpb.GetCodeClaimRequest(claim_id=first.id), metadata=STAFF)) == first
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.GetCodeClaim(cpb.GetCodeClaimRequest(claim_id=first.id), metadata=customer("cust-" + new_id()))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # the buyer's list: both claims on their order, the staff's one included
    mine = await claims.ListCodeClaims(cpb.ListCodeClaimsRequest(), metadata=customer(buyer))
    assert [c.id for c in mine.claims] == [first.id, staffs.id]
    page = await claims.ListCodeClaims(cpb.ListCodeClaimsRequest(page_size=1), metadata=customer(buyer))
    rest = await claims.ListCodeClaims(cpb.ListCodeClaimsRequest(page_size=1, page_token=page.next_page_token),
                                       metadata=customer(buyer))
    assert [c.id for c in list(page.claims) + list(rest.claims)] == [first.id, staffs.id]


async def test_a_replacement_comes_from_another_batch_and_the_buyer_never_sees_the_revoked_code(stub, claims, cp_pool):
    product_id = await new_product(stub)
    first_batch = await import_batch(stub, product_id, 3)
    other_batch = await import_batch(stub, product_id, 2)
    order_id, (code,), buyer = await bought(stub, product_id)
    assert await cp_pool.fetchval("SELECT batch_id FROM codes WHERE id = $1", uuid.UUID(code)) == uuid.UUID(first_batch)
    claim = await open_claim(claims, order_id, code, customer(buyer))
    before = await stock(stub, product_id)
    replaced = await claims.SettleCodeClaim(settle(claim.id, cpb.SETTLE_STEP_REPLACE, "new code sent"))
    assert replaced.status == cpb.CLAIM_STATUS_REPLACED and replaced.replacement_code_id
    new = uuid.UUID(replaced.replacement_code_id)
    assert await cp_pool.fetchval("SELECT batch_id FROM codes WHERE id = $1", new) == uuid.UUID(other_batch)
    # replayed: the same answer, no second code
    assert await claims.SettleCodeClaim(settle(claim.id, cpb.SETTLE_STEP_REPLACE, "new code sent")) == replaced
    # a resolved claim takes no other resolution
    for step in (cpb.SETTLE_STEP_REJECT, cpb.SETTLE_STEP_REFUND):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await claims.SettleCodeClaim(settle(claim.id, step, "no"))
        assert error_reason(e.value) == "claim-resolved"
    # the buyer's codes are the replacement; the reservation names it
    plain = await stub.GetDeliveredCodes(pb.GetDeliveredCodesRequest(order_id=order_id, customer_id=buyer))
    assert [c.id for c in plain.codes] == [str(new)]
    assert [r["code_id"] for r in await cp_pool.fetch(
        "SELECT code_id FROM deliveries WHERE order_id = $1 AND status = 'delivered'", order_id)] == [new]
    assert await cp_pool.fetchval("SELECT status FROM codes WHERE id = $1", uuid.UUID(code)) == "revoked"
    assert await cp_pool.fetchval("SELECT status FROM deliveries WHERE order_id = $1 AND code_id = $2", order_id,
                                  uuid.UUID(code)) == "revoked"
    after = await stock(stub, product_id)
    assert (after.available, after.delivered, after.revoked) == (before.available - 1, before.delivered,
                                                                 before.revoked + 1)
    # a revoked code is final, and cannot be claimed again
    with pytest.raises(Exception):
        await cp_pool.execute("UPDATE codes SET status = 'available' WHERE id = $1", uuid.UUID(code))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await open_claim(claims, order_id, code, customer(buyer))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    types = [r["type"] for r in await cp_pool.fetch("SELECT type FROM stock_events WHERE order_id = $1 ORDER BY seq",
                                                     order_id)]
    assert types == ["code.claimed", "code.replaced"]
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE order_id = $1 AND action = 'claim_replace'",
                                  order_id) == 1


async def test_concurrent_replacements_take_distinct_codes_and_a_claim_is_replaced_once(stub, claims, cp_pool):
    """12 claims of 12 orders replaced at once, each asked 3 times concurrently, with 12 codes left:
    every claim gets exactly one code, no code goes to two orders (checked in the database)."""
    product_id = await new_product(stub)
    await import_batch(stub, product_id, 24)
    orders = [await bought(stub, product_id) for _ in range(12)]
    opened = [await open_claim(claims, o, c[0], customer(b)) for o, c, b in orders]
    results = await asyncio.gather(*(claims.SettleCodeClaim(settle(c.id, cpb.SETTLE_STEP_REPLACE))
                                     for c in opened for _ in range(3)))
    by_claim = {}
    for r in results:
        by_claim.setdefault(r.id, set()).add(r.replacement_code_id)
    assert all(len(v) == 1 for v in by_claim.values()) and len(by_claim) == 12
    assert len({next(iter(v)) for v in by_claim.values()}) == 12
    ids = [o for o, _, _ in orders]
    assert await cp_pool.fetchval(
        "SELECT count(*) FROM deliveries WHERE order_id = ANY($1) AND status = 'delivered'", ids) == 12
    assert await cp_pool.fetchval(
        "SELECT count(DISTINCT code_id) FROM deliveries WHERE product_id = $1 AND status IN ('reserved', 'delivered')",
        uuid.UUID(product_id)) == 12
    s = await stock(stub, product_id)
    assert (s.available, s.delivered, s.revoked) == (0, 12, 12)
    # no code left: the next replacement is refused and its claim stays open
    late = orders[0]
    new_code = next(iter(by_claim[opened[0].id]))
    claim = await open_claim(claims, late[0], new_code, customer(late[2]))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.SettleCodeClaim(settle(claim.id, cpb.SETTLE_STEP_REPLACE))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await claims.GetCodeClaim(cpb.GetCodeClaimRequest(claim_id=claim.id))).status == cpb.CLAIM_STATUS_OPEN


async def test_refund_steps_and_rejection(stub, claims, cp_pool):
    product_id = await new_product(stub, price=2500)
    await import_batch(stub, product_id, 4)
    order_id, (a, b), buyer = await bought(stub, product_id, 2)
    ca = await open_claim(claims, order_id, a, customer(buyer))
    refunding = await claims.SettleCodeClaim(settle(ca.id, cpb.SETTLE_STEP_REFUND, "refund it"))
    assert refunding.status == cpb.CLAIM_STATUS_REFUNDING
    assert (refunding.refund.amount_minor, refunding.refund.currency_code) == (2500, "TRY")
    assert (await claims.SettleCodeClaim(settle(ca.id, cpb.SETTLE_STEP_REFUND, "refund it"))) == refunding
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.SettleCodeClaim(settle(ca.id, cpb.SETTLE_STEP_REPLACE))
    assert error_reason(e.value) == "claim-resolved"
    # a refused refund reopens it; decided again, then refunded: the code is taken back
    assert (await claims.SettleCodeClaim(settle(ca.id, cpb.SETTLE_STEP_REOPEN, "psp refused"))).status == \
        cpb.CLAIM_STATUS_OPEN
    await claims.SettleCodeClaim(settle(ca.id, cpb.SETTLE_STEP_REFUND, "again"))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.SettleCodeClaim(settle(ca.id, cpb.SETTLE_STEP_REFUNDED))
    assert bad_field(e.value) == "refund_id"
    done = await claims.SettleCodeClaim(settle(ca.id, cpb.SETTLE_STEP_REFUNDED, refund_id="rf-1"))
    assert done.status == cpb.CLAIM_STATUS_REFUNDED and done.refund_id == "rf-1"
    plain = await stub.GetDeliveredCodes(pb.GetDeliveredCodesRequest(order_id=order_id, customer_id=buyer))
    assert [c.id for c in plain.codes] == [b]
    # a rejection needs a note, and keeps the code the buyer's
    cb = await open_claim(claims, order_id, b, customer(buyer))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.SettleCodeClaim(settle(cb.id, cpb.SETTLE_STEP_REJECT))
    assert bad_field(e.value) == "note"
    rejected = await claims.SettleCodeClaim(settle(cb.id, cpb.SETTLE_STEP_REJECT, "the code was redeemed by you"))
    assert rejected.status == cpb.CLAIM_STATUS_REJECTED and rejected.resolution_note == "the code was redeemed by you"
    assert await cp_pool.fetchval("SELECT status FROM codes WHERE id = $1", uuid.UUID(b)) == "delivered"
    types = [r["type"] for r in await cp_pool.fetch("SELECT type FROM stock_events WHERE order_id = $1 ORDER BY seq",
                                                     order_id)]
    assert types == ["code.claimed", "code.claim_refunded", "code.claimed", "code.claim_rejected"]
    # only the orchestrator settles: a user is refused even with the right certificate
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await claims.SettleCodeClaim(settle(cb.id, cpb.SETTLE_STEP_REJECT, "x"), metadata=ADMIN)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_the_database_allows_one_unresolved_claim_per_code(stub, claims, cp_pool):
    product_id = await new_product(stub)
    await import_batch(stub, product_id, 2)
    order_id, (code,), buyer = await bought(stub, product_id)
    results = await asyncio.gather(*(open_claim(claims, order_id, code, customer(buyer)) for _ in range(10)),
                                   return_exceptions=True)
    ok = [r for r in results if not isinstance(r, Exception)]
    assert len(ok) == 1
    assert all(error_reason(r) == "claim-open" for r in results if isinstance(r, Exception))
    assert await cp_pool.fetchval("SELECT count(*) FROM code_claims WHERE code_id = $1", uuid.UUID(code)) == 1
