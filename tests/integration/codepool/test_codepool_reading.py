"""Stock, the staff list (masked), the admin reveal (audited, counted) and the buyer's own codes."""
import uuid

import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from cuty.common.v1 import common_pb2
from cutylib.testing.ids import new_id

from codepool_testkit import ADMIN, STAFF, customer, reserve_request, stock_of, stocked_product


async def test_products(stub):
    got = await stub.CreateProduct(pb.CreateProductRequest(
        sku="sku-" + new_id()[:12], name="Gift card", price=common_pb2.Money(currency_code="TRY", amount_minor=4500)),
        metadata=ADMIN)
    assert (got.price.amount_minor, got.price.currency_code, got.name) == (4500, "TRY", "Gift card")
    assert (await stub.GetStock(pb.GetStockRequest(product_id=got.id), metadata=STAFF)).available == 0
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.CreateProduct(pb.CreateProductRequest(sku=got.sku, name="again", price=got.price), metadata=ADMIN)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    for bad, field in ((pb.CreateProductRequest(sku="", name="n", price=got.price), "sku"),
                       (pb.CreateProductRequest(sku="s-" + new_id()[:8], name=" ", price=got.price), "name"),
                       (pb.CreateProductRequest(sku="s-" + new_id()[:8], name="n"), "price.currency_code")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.CreateProduct(bad, metadata=ADMIN)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.CreateProduct(pb.CreateProductRequest(sku="x", name="n", price=got.price), metadata=STAFF)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetStock(pb.GetStockRequest(product_id=str(uuid.uuid4())), metadata=STAFF)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_staff_list_masked_codes_in_pages(stub):
    product_id, codes = await stocked_product(stub, 7)
    await stub.ReserveCodes(reserve_request(product_id, 2))
    seen, token = [], ""
    while True:
        page = await stub.ListCodes(pb.ListCodesRequest(product_id=product_id, page_size=3, page_token=token),
                                    metadata=STAFF)
        seen += page.codes
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == 7 and len({c.id for c in seen}) == 7
    assert sorted(c.masked_value for c in seen) == sorted("****" + c[-4:] for c in codes)
    assert sorted(c.status for c in seen) == ["available"] * 5 + ["reserved"] * 2
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=customer("c"))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ListCodes(pb.ListCodesRequest(product_id=product_id, page_token="garbage!"), metadata=STAFF)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_reveal_is_admin_only_audited_and_counted(stub, cp_pool):
    product_id, codes = await stocked_product(stub, 2)
    listed = await stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=ADMIN)
    code_id = listed.codes[0].id
    for role, code in ((STAFF, grpc.StatusCode.PERMISSION_DENIED), (customer("c"), grpc.StatusCode.PERMISSION_DENIED),
                       ((), grpc.StatusCode.UNAUTHENTICATED), ((("cuty-role", "admin"),), grpc.StatusCode.UNAUTHENTICATED)):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.RevealCode(pb.RevealCodeRequest(code_id=code_id), metadata=role)
        assert e.value.code() == code
    first = await stub.RevealCode(pb.RevealCodeRequest(code_id=code_id), metadata=ADMIN)
    second = await stub.RevealCode(pb.RevealCodeRequest(code_id=code_id), metadata=ADMIN)
    assert first.value == second.value and first.value in codes
    assert (first.view_count, second.view_count) == (1, 2)
    audit = await cp_pool.fetch("SELECT actor, details FROM audit_log WHERE action = 'reveal' AND code_ids = ARRAY[$1::uuid]",
                                uuid.UUID(code_id))
    assert [a["actor"] for a in audit] == ["admin:admin-1"] * 2
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.RevealCode(pb.RevealCodeRequest(code_id=str(uuid.uuid4())), metadata=ADMIN)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_buyer_reads_its_own_codes_once_delivered(stub):
    """The buyer reads its codes through the orchestrator, which names it (`customer_id`); no user
    reaches GetDeliveredCodes itself, not even the buyer (only the gateway brings users, and it
    has no route here)."""
    product_id, codes = await stocked_product(stub, 3)
    res = await stub.ReserveCodes(reserve_request(product_id, 2, customer_id="alice"))
    mine = pb.GetDeliveredCodesRequest(order_id=res.order_id, customer_id="alice")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetDeliveredCodes(mine)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # reserved, not delivered yet
    await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=res.order_id, payment_transaction_id="p-" + res.order_id))
    got = await stub.GetDeliveredCodes(mine)
    assert [c.id for c in got.codes] == list(res.code_ids)
    assert {c.value for c in got.codes} <= set(codes) and len(got.codes) == 2
    for req, md, code in (
        (mine, customer("alice"), grpc.StatusCode.PERMISSION_DENIED),
        (pb.GetDeliveredCodesRequest(order_id=res.order_id, customer_id="bob"), (), grpc.StatusCode.NOT_FOUND),
        (mine, STAFF, grpc.StatusCode.PERMISSION_DENIED),
        (mine, ADMIN, grpc.StatusCode.PERMISSION_DENIED),
        (pb.GetDeliveredCodesRequest(order_id="nope", customer_id="alice"), (), grpc.StatusCode.NOT_FOUND),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.GetDeliveredCodes(req, metadata=md)
        assert e.value.code() == code


async def test_stock_requires_staff_and_a_known_product(stub):
    product_id, _ = await stocked_product(stub, 1)
    assert await stock_of(stub, product_id) == (1, 0, 0)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=customer("c"))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetStock(pb.GetStockRequest(product_id=str(uuid.uuid4())), metadata=STAFF)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_every_plaintext_read_is_audited_and_counted(stub, cp_pool):
    """The buyer's reads of its codes are audited and counted like an admin's reveal."""
    from codepool import metrics

    product_id, _ = await stocked_product(stub, 2)
    buyer = "buyer-" + new_id()
    res = await stub.ReserveCodes(reserve_request(product_id, 2, customer_id=buyer))
    await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=res.order_id, payment_transaction_id="p-" + res.order_id))
    before = metrics.REGISTRY.value("cuty_codepool_codes_read_by_buyer_total")
    for _ in range(2):  # the orchestrator, for the buyer
        await stub.GetDeliveredCodes(pb.GetDeliveredCodesRequest(order_id=res.order_id, customer_id=buyer))
    reads = await cp_pool.fetch("SELECT actor, code_ids, details FROM audit_log WHERE order_id = $1 "
                                "AND action = 'read_delivered' ORDER BY id", res.order_id)
    assert [r["actor"] for r in reads] == ["system", "system"]
    assert all(sorted(map(str, r["code_ids"])) == sorted(res.code_ids) and r["details"] == {"customer_id": buyer}
               for r in reads)
    views = await cp_pool.fetch("SELECT views FROM code_views WHERE code_id = ANY($1::uuid[])", list(res.code_ids))
    assert [v["views"] for v in views] == [2, 2]
    assert metrics.REGISTRY.value("cuty_codepool_codes_read_by_buyer_total") - before == 4
    revealed = metrics.REGISTRY.value("cuty_codepool_reveals_total")
    await stub.RevealCode(pb.RevealCodeRequest(code_id=res.code_ids[0]), metadata=ADMIN)
    assert metrics.REGISTRY.value("cuty_codepool_reveals_total") == revealed + 1
    # A refused read leaves no record.
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.GetDeliveredCodes(pb.GetDeliveredCodesRequest(order_id=res.order_id, customer_id="x" + buyer))
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE order_id = $1 AND action = 'read_delivered'",
                                  res.order_id) == 2
