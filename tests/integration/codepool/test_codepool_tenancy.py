"""Merchants as tenants in the code pool: every staff/admin RPC sees only its merchant,
the operator reads across merchants audited, the database refuses moves between merchants, and
Row-Level Security bites a query that forgot its WHERE."""
from __future__ import annotations

import uuid

import asyncpg
import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from cuty.common.v1 import common_pb2
from cutylib.testing.ids import new_id
from cutylib.testing.tenancy import PARTITIONS_WITHOUT_RLS, probe_role, rows_seen
from cutylib.testing.trust import TEST_MERCHANT, user

from codepool_testkit import ADMIN, STAFF, make_codes, reserve_request, stocked_product

# Every table of the code pool that belongs to a merchant; test_every_merchant_table_has_rls checks
# the catalogue agrees (a new table with merchant_id must be added here and declared with cuty_tenant_table).
MERCHANT_TABLES = ("products", "supplier_batches", "codes", "reservations", "deliveries", "payment_transactions",
                   "code_views", "audit_log", "stock_events", "product_stock", "code_claims", "stock_summary")
# Where finished orders move (test_codepool_order_retention.py fills and reads them per merchant).
HISTORY_TABLES = ("reservations_history", "deliveries_history", "payment_transactions_history")
OPERATOR = user("op-1", "operator")


def merchant() -> str:
    return "m-" + new_id()[:12]


async def _rpc_error(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


async def _product_of(stub, org: str, n: int = 0, sku: str | None = None, low_stock_threshold: int = 10) -> str:
    admin = user("admin-" + org, "admin", org)
    p = await stub.CreateProduct(pb.CreateProductRequest(
        sku=sku or "sku-" + new_id()[:12], name="Gift card", price=common_pb2.Money(currency_code="TRY", amount_minor=500),
        low_stock_threshold=low_stock_threshold), metadata=admin)
    assert p.merchant_id == org
    if n:
        resp = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=p.id, batch_ref="b-" + new_id(),
                                                                    codes=make_codes(n)), metadata=admin)
        assert resp.accepted
    return p.id


# --- products ------------------------------------------------------------------------------------
async def test_a_product_is_created_in_the_admins_merchant(stub, cp_pool):
    p = await stub.CreateProduct(pb.CreateProductRequest(
        sku="sku-" + new_id()[:12], name="Card", price=common_pb2.Money(currency_code="TRY", amount_minor=1)),
        metadata=ADMIN)
    assert p.merchant_id == TEST_MERCHANT
    assert await cp_pool.fetchval("SELECT merchant_id FROM products WHERE id = $1", uuid.UUID(p.id)) == TEST_MERCHANT
    assert (await stub.GetStock(pb.GetStockRequest(product_id=p.id), metadata=STAFF)).product_id == p.id


async def test_a_sku_is_unique_within_a_merchant_only(stub):
    sku = "sku-" + new_id()[:12]
    one, two = merchant(), merchant()
    a = await _product_of(stub, one, sku=sku)
    b = await _product_of(stub, two, sku=sku)
    assert a != b
    e = await _rpc_error(stub.CreateProduct(pb.CreateProductRequest(
        sku=sku, name="again", price=common_pb2.Money(currency_code="TRY", amount_minor=1)),
        metadata=user("admin-x", "admin", one)))
    assert e.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_a_product_of_another_merchant_is_not_found_for_its_staff(stub):
    product_id = await _product_of(stub, merchant())
    e = await _rpc_error(stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=STAFF))
    assert e.code() == grpc.StatusCode.NOT_FOUND


# --- import --------------------------------------------------------------------------------------
async def test_import_into_another_merchants_product_is_not_found_like_a_missing_one(stub):
    product_id = await _product_of(stub, merchant())
    missing = str(uuid.uuid4())
    errors = {}
    for pid in (product_id, missing):
        errors[pid] = await _rpc_error(stub.ImportCodeBatch(
            pb.ImportCodeBatchRequest(product_id=pid, batch_ref="b", codes=make_codes(2)), metadata=ADMIN))
    assert {e.code() for e in errors.values()} == {grpc.StatusCode.NOT_FOUND}
    assert errors[product_id].details().replace(product_id, "X") == errors[missing].details().replace(missing, "X")
    s = await stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=OPERATOR)
    assert s.available == 0


async def test_imported_rows_take_the_products_merchant(stub, cp_pool):
    org = merchant()
    product_id = await _product_of(stub, org, n=3)
    pid = uuid.UUID(product_id)
    for table in ("supplier_batches", "codes", "audit_log"):
        got = {r[0] for r in await cp_pool.fetch(f"SELECT merchant_id FROM {table} WHERE product_id = $1", pid)}
        assert got == {org}, table


async def test_the_import_command_identity_imports_into_any_merchants_product(stub, cp_pool):
    # `python -m codepool import` dials as the code pool itself (system): the product names the merchant
    org = merchant()
    product_id = await _product_of(stub, org)
    resp = await stub.ImportCodes(iter([pb.ImportCodesChunk(product_id=product_id, batch_ref="cli-" + new_id(),
                                                            codes=make_codes(4))]))
    assert resp.accepted and resp.imported == 4
    assert await cp_pool.fetchval("SELECT array_agg(DISTINCT merchant_id) FROM codes WHERE product_id = $1",
                                  uuid.UUID(product_id)) == [org]


# --- stock, codes, reveal ------------------------------------------------------------------------
@pytest.mark.parametrize("role", ["staff", "admin"])
async def test_stock_and_codes_of_another_merchant_are_not_found(stub, role):
    own, _ = await stocked_product(stub, 2)
    other = await _product_of(stub, merchant(), n=2)
    me = user(f"{role}-1", role)
    assert (await stub.GetStock(pb.GetStockRequest(product_id=own), metadata=me)).available == 2
    assert len((await stub.ListCodes(pb.ListCodesRequest(product_id=own), metadata=me)).codes) == 2
    missing = str(uuid.uuid4())
    for call in (lambda pid: stub.GetStock(pb.GetStockRequest(product_id=pid), metadata=me),
                 lambda pid: stub.ListCodes(pb.ListCodesRequest(product_id=pid), metadata=me)):
        e_other, e_missing = await _rpc_error(call(other)), await _rpc_error(call(missing))
        assert e_other.code() == e_missing.code() == grpc.StatusCode.NOT_FOUND
        assert e_other.details().replace(other, "X") == e_missing.details().replace(missing, "X")


async def test_reveal_only_in_the_admins_own_merchant(stub):
    own, _ = await stocked_product(stub, 1)
    other = await _product_of(stub, merchant(), n=1)
    own_code = (await stub.ListCodes(pb.ListCodesRequest(product_id=own), metadata=STAFF)).codes[0].id
    other_code = (await stub.ListCodes(pb.ListCodesRequest(product_id=other), metadata=OPERATOR)).codes[0].id
    assert (await stub.RevealCode(pb.RevealCodeRequest(code_id=own_code), metadata=ADMIN)).value
    e_other = await _rpc_error(stub.RevealCode(pb.RevealCodeRequest(code_id=other_code), metadata=ADMIN))
    missing = str(uuid.uuid4())
    e_missing = await _rpc_error(stub.RevealCode(pb.RevealCodeRequest(code_id=missing), metadata=ADMIN))
    assert e_other.code() == e_missing.code() == grpc.StatusCode.NOT_FOUND
    assert e_other.details().replace(other_code, "X") == e_missing.details().replace(missing, "X")
    e = await _rpc_error(stub.RevealCode(pb.RevealCodeRequest(code_id=other_code), metadata=OPERATOR))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_an_org_that_owns_nothing_sees_nothing(stub):
    product_id, _ = await stocked_product(stub, 1)
    code_id = (await stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=STAFF)).codes[0].id
    nobody = merchant()
    for md in (user("staff-n", "staff", nobody), user("admin-n", "admin", nobody)):
        for call in (stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=md),
                     stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=md)):
            assert (await _rpc_error(call)).code() == grpc.StatusCode.NOT_FOUND
    admin = user("admin-n", "admin", nobody)
    assert (await _rpc_error(stub.RevealCode(pb.RevealCodeRequest(code_id=code_id), metadata=admin))).code() \
        == grpc.StatusCode.NOT_FOUND
    assert (await _rpc_error(stub.ImportCodeBatch(pb.ImportCodeBatchRequest(
        product_id=product_id, batch_ref="b", codes=make_codes(1)), metadata=admin))).code() == grpc.StatusCode.NOT_FOUND


async def test_staff_and_admin_without_a_merchant_are_unauthenticated(stub):
    product_id, _ = await stocked_product(stub, 1)
    code_id = (await stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=STAFF)).codes[0].id
    res = await stub.ReserveCodes(reserve_request(product_id, 1))
    for role in ("staff", "admin"):
        md = user(f"{role}-no-org", role, "")
        calls = [stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=md),
                 stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=md)]
        if role == "admin":
            calls += [stub.RevealCode(pb.RevealCodeRequest(code_id=code_id), metadata=md),
                      stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b",
                                                                     codes=make_codes(1)), metadata=md),
                      stub.CreateProduct(pb.CreateProductRequest(
                          sku="sku-" + new_id()[:12], name="n",
                          price=common_pb2.Money(currency_code="TRY", amount_minor=1)), metadata=md)]
        for call in calls:
            assert (await _rpc_error(call)).code() == grpc.StatusCode.UNAUTHENTICATED


async def test_operator_reads_any_merchant_and_every_read_is_audited(stub, cp_pool):
    org = merchant()
    product_id = await _product_of(stub, org, n=3)
    s = await stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=OPERATOR)
    assert s.available == 3
    page = await stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=OPERATOR)
    assert len(page.codes) == 3
    rows = await cp_pool.fetch("SELECT merchant_id, actor, code_ids, details FROM audit_log "
                               "WHERE product_id = $1 AND action = 'operator_read' ORDER BY id", uuid.UUID(product_id))
    assert [(r["merchant_id"], r["actor"], r["details"]) for r in rows] == [
        (org, "operator:op-1", {"rpc": "GetStock", "subject": "op-1", "role": "operator"}),
        (org, "operator:op-1", {"rpc": "ListCodes", "subject": "op-1", "role": "operator"})]
    assert rows[0]["code_ids"] is None
    assert sorted(str(c) for c in rows[1]["code_ids"]) == sorted(c.id for c in page.codes)
    # a merchant's own staff reading is not an operator read
    before = len(rows)
    await stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=user("s", "staff", org))
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE product_id = $1 AND action = 'operator_read'",
                                  uuid.UUID(product_id)) == before
    # a refused read records nothing
    missing = str(uuid.uuid4())
    assert (await _rpc_error(stub.GetStock(pb.GetStockRequest(product_id=missing), metadata=OPERATOR))).code() \
        == grpc.StatusCode.NOT_FOUND


async def test_customers_and_operators_are_refused_the_merchant_only_rpcs(stub):
    product_id, _ = await stocked_product(stub, 1)
    for md in (user("c-1", "customer"),):
        for call in (stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=md),
                     stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=md)):
            assert (await _rpc_error(call)).code() == grpc.StatusCode.PERMISSION_DENIED
    for call in (stub.CreateProduct(pb.CreateProductRequest(sku="s", name="n", price=common_pb2.Money(
                     currency_code="TRY", amount_minor=1)), metadata=OPERATOR),
                 stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b",
                                                                codes=make_codes(1)), metadata=OPERATOR)):
        assert (await _rpc_error(call)).code() == grpc.StatusCode.PERMISSION_DENIED


# --- reservations --------------------------------------------------------------------------------
async def test_every_reservation_answer_carries_the_products_merchant(stub):
    org = merchant()
    product_id = await _product_of(stub, org, n=3)
    res = await stub.ReserveCodes(reserve_request(product_id, 1))
    assert res.merchant_id == org
    again = await stub.ReserveCodes(reserve_request(product_id, 1, order_id=res.order_id, customer_id=res.customer_id))
    assert again.merchant_id == org and again.code_ids == res.code_ids
    delivered = await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=res.order_id,
                                                               payment_transaction_id="p-" + res.order_id))
    assert delivered.merchant_id == org
    other = await stub.ReserveCodes(reserve_request(product_id, 1))
    assert (await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=other.order_id))).merchant_id == org


# --- the database --------------------------------------------------------------------------------
async def _one_of_everything(stub, org: str, db) -> str:
    """A product of `org` with a row in every merchant table (the reservation is a stock.low crossing;
    the claim is opened by the database function the service calls, through `db`)."""
    product_id = await _product_of(stub, org, n=3, low_stock_threshold=2)
    res = await stub.ReserveCodes(reserve_request(product_id, 1))
    await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=res.order_id, payment_transaction_id="p-" + res.order_id))
    await stub.RevealCode(pb.RevealCodeRequest(code_id=res.code_ids[0]), metadata=user("a", "admin", org))
    await db.execute("SELECT codepool_claim_open(gen_random_uuid(), $1, $2, NULL, NULL, 'does_not_work', 'tenancy', "
                     "'system')", res.order_id, uuid.UUID(res.code_ids[0]))
    return product_id


async def test_moving_rows_between_merchants_is_refused(stub, cp_pool):
    org = merchant()
    product_id = uuid.UUID(await _one_of_everything(stub, org, cp_pool))
    lonely = uuid.UUID(await _product_of(stub, org))  # no children: only the trigger stands in the way
    await cp_pool.execute("UPDATE products SET name = 'renamed' WHERE id = $1", lonely)  # other columns may change
    where = {"products": "id = $1",
             "payment_transactions": "order_id IN (SELECT order_id FROM reservations WHERE product_id = $1)"}
    async with cp_pool.acquire() as conn:
        for table in MERCHANT_TABLES:
            pid = lonely if table == "products" else product_id
            # the tenancy trigger, a composite foreign key, or (audit_log) no UPDATE at all
            with pytest.raises((asyncpg.IntegrityConstraintViolationError, asyncpg.InsufficientPrivilegeError)):
                async with conn.transaction():
                    status = await conn.execute(f"UPDATE {table} SET merchant_id = 'm-elsewhere' "
                                                f"WHERE {where.get(table, 'product_id = $1')}", pid)
                    raise AssertionError(f"{table}: {status}")
        with pytest.raises(asyncpg.IntegrityConstraintViolationError):
            await conn.execute("UPDATE products SET merchant_id = 'm-elsewhere' WHERE id = $1", product_id)
    for table in MERCHANT_TABLES:
        assert await cp_pool.fetchval(f"SELECT count(*) FROM {table} WHERE merchant_id = 'm-elsewhere'") == 0


async def test_a_child_cannot_name_another_merchant_than_its_parent(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 1)
    res = await stub.ReserveCodes(reserve_request(product_id, 1))
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await cp_pool.execute(
            "INSERT INTO payment_transactions (merchant_id, transaction_id, order_id, outcome) "
            "VALUES ('m-elsewhere', $1, $2, 'delivered')", "t-" + new_id(), res.order_id)


async def test_row_level_security_bites_a_query_without_where(stub, codepool_dsn):
    org = merchant()
    conn = await asyncpg.connect(codepool_dsn)
    await _one_of_everything(stub, org, conn)
    try:
        async with probe_role(conn) as role:
            counts = {s: {t: await rows_seen(conn, role, t, s) for t in MERCHANT_TABLES} for s in ("wrong", org, None, "*")}
            own_only = {t: await rows_seen(conn, role, t, org, "merchant_id <> $1", org) for t in MERCHANT_TABLES}
    finally:
        await conn.close()
    assert counts["wrong"] == {t: 0 for t in MERCHANT_TABLES}
    assert counts[None] == {t: 0 for t in MERCHANT_TABLES}  # unset: nobody's (fail closed); '*' says every merchant
    assert all(n > 0 for n in counts[org].values()), counts[org]
    assert own_only == {t: 0 for t in MERCHANT_TABLES}
    assert all(counts["*"][t] >= counts[org][t] for t in MERCHANT_TABLES)


async def test_every_merchant_table_has_forced_rls_and_a_policy(cp_pool):
    rows = await cp_pool.fetch("""
        SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
               EXISTS (SELECT FROM pg_policy p WHERE p.polrelid = c.oid) AS has_policy
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
          AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'merchant_id'
                      AND NOT a.attisdropped)""")
    assert sorted(r["relname"] for r in rows) == sorted(MERCHANT_TABLES + HISTORY_TABLES)
    for r in rows:
        assert r["relrowsecurity"] and r["relforcerowsecurity"] and r["has_policy"], dict(r)
    # The audit log's partitions too: the role may name one directly.
    assert await cp_pool.fetch(PARTITIONS_WITHOUT_RLS) == []


async def test_every_row_names_its_merchant_there_is_no_default(cp_pool):
    """merchant_id is NOT NULL with no default in every merchant table: an insert takes it from the
    parent row, and one that forgot it fails instead of landing in some merchant."""
    rows = await cp_pool.fetch("""
        SELECT c.relname, a.attnotnull, a.atthasdef
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND a.attname = 'merchant_id'
          AND NOT a.attisdropped""")
    not_null_no_default = {r["relname"]: (r["attnotnull"], r["atthasdef"]) for r in rows}
    assert not_null_no_default == {t: (True, False) for t in MERCHANT_TABLES + HISTORY_TABLES}
    with pytest.raises(asyncpg.NotNullViolationError):
        await cp_pool.execute("INSERT INTO products (id, sku, name, price_minor, currency) "
                              "VALUES ($1, $2, 'New', 1, 'TRY')", uuid.uuid4(), "sku-" + new_id()[:12])


async def test_reserve_plan_still_walks_codes_available_in_order(stub, cp_pool):
    """The hot path's scan names the merchant through an InitPlan, so the partial index still yields
    seq order: no Sort, no walk over other merchants' or sold codes."""
    product_id, _ = await stocked_product(stub, 3000)
    await cp_pool.execute("ANALYZE codes")
    plan = "\n".join(r[0] for r in await cp_pool.fetch(
        "EXPLAIN WITH r AS (SELECT merchant_id FROM products WHERE id = $1) "
        "SELECT c.id FROM codes c WHERE c.merchant_id = (SELECT r.merchant_id FROM r) AND c.product_id = $1 "
        "AND c.status = 'available' ORDER BY c.seq LIMIT 2 FOR UPDATE SKIP LOCKED", uuid.UUID(product_id)))
    assert "codes_available" in plan and "Sort" not in plan, plan
