"""The database refuses what the rules forbid, even from hand-written SQL."""
import itertools
import uuid

import asyncpg
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from codepool import domain

from codepool_testkit import reserve_request, stocked_product

STATUSES = (domain.AVAILABLE, domain.RESERVED, domain.DELIVERED)


async def _code_in(conn, product_id: str, status: str) -> uuid.UUID:
    """A code of the product brought to `status` through the allowed path, in SQL."""
    code_id = await conn.fetchval(
        "SELECT id FROM codes WHERE product_id = $1 AND status = 'available' ORDER BY id LIMIT 1", uuid.UUID(product_id))
    path = {"available": [], "reserved": ["reserved"], "delivered": ["reserved", "delivered"]}[status]
    for s in path:
        await conn.execute("UPDATE codes SET status = $2 WHERE id = $1", code_id, s)
    return code_id


async def test_code_transitions_are_exactly_the_domain_table(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 20)
    seen = {}
    async with cp_pool.acquire() as conn:
        for old, new in itertools.product(STATUSES, STATUSES):
            if old == new:
                continue
            tx = conn.transaction()
            await tx.start()
            try:
                code_id = await _code_in(conn, product_id, old)
                try:
                    async with conn.transaction():
                        await conn.execute("UPDATE codes SET status = $2 WHERE id = $1", code_id, new)
                    seen[(old, new)] = True
                except asyncpg.CheckViolationError:
                    seen[(old, new)] = False
            finally:
                await tx.rollback()
    assert {k for k, ok in seen.items() if ok} == domain.CODE_TRANSITIONS
    assert len(seen) == 6


async def test_status_times_come_from_the_database_and_delivered_is_final(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 3)
    async with cp_pool.acquire() as conn:
        code_id = await _code_in(conn, product_id, "delivered")
        row = await conn.fetchrow("SELECT reserved_at, delivered_at FROM codes WHERE id = $1", code_id)
        assert row["reserved_at"] is not None and row["delivered_at"] >= row["reserved_at"]
        for sql in ("UPDATE codes SET status = 'available' WHERE id = $1",
                    "UPDATE codes SET delivered_at = now() - interval '1 day' WHERE id = $1",
                    "UPDATE codes SET code_hash = sha256('x'::bytea) WHERE id = $1",
                    "UPDATE codes SET product_id = gen_random_uuid() WHERE id = $1",
                    "DELETE FROM codes WHERE id = $1"):
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(sql, code_id)
        assert await conn.fetchval("SELECT status FROM codes WHERE id = $1", code_id) == "delivered"


async def test_a_status_change_cannot_smuggle_a_new_ciphertext(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 2)
    async with cp_pool.acquire() as conn:
        code_id = await _code_in(conn, product_id, "available")
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE codes SET status = 'reserved', ciphertext = ciphertext || '\\x00'::bytea "
                               "WHERE id = $1", code_id)


async def test_a_code_is_in_at_most_one_active_delivery(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 3)
    res = await stub.ReserveCodes(reserve_request(product_id, 1))
    other = await stub.ReserveCodes(reserve_request(product_id, 1))
    with pytest.raises(asyncpg.UniqueViolationError):
        await cp_pool.execute(
            "INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status) "
            "VALUES ($5, $1, $2, $3, 'c', $4, 'reserved')",
            other.order_id, other.order_item_id, uuid.UUID(product_id), uuid.UUID(res.code_ids[0]), other.merchant_id)


async def test_reservation_and_delivery_transitions_and_history(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 3)
    res = await stub.ReserveCodes(reserve_request(product_id, 1))
    await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=res.order_id, payment_transaction_id="p-" + res.order_id))
    for sql in ("UPDATE reservations SET status = 'released', released_at = now(), release_reason = 'released' "
                "WHERE order_id = $1",
                "UPDATE reservations SET status = 'reserved' WHERE order_id = $1",
                "UPDATE deliveries SET status = 'released' WHERE order_id = $1",
                "UPDATE deliveries SET status = 'reserved' WHERE order_id = $1"):
        with pytest.raises(asyncpg.CheckViolationError):
            await cp_pool.execute(sql, res.order_id)
    for sql in ("DELETE FROM deliveries WHERE order_id = $1", "DELETE FROM reservations WHERE order_id = $1",
                "DELETE FROM payment_transactions WHERE order_id = $1"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await cp_pool.execute(sql, res.order_id)


async def test_audit_log_is_append_only(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 1)
    res = await stub.ReserveCodes(reserve_request(product_id, 1))
    audit_id = await cp_pool.fetchval("SELECT id FROM audit_log WHERE order_id = $1", res.order_id)
    for sql, args in (("UPDATE audit_log SET actor = 'someone else' WHERE id = $1", (audit_id,)),
                      ("DELETE FROM audit_log WHERE id = $1", (audit_id,)),
                      ("TRUNCATE audit_log", ())):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await cp_pool.execute(sql, *args)
    row = await cp_pool.fetchrow("SELECT actor, action, code_ids FROM audit_log WHERE id = $1", audit_id)
    assert (row["actor"], row["action"], [str(c) for c in row["code_ids"]]) == ("system", "reserve", list(res.code_ids))


async def test_reserve_query_uses_the_partial_index(stub, cp_pool):
    product_id, _ = await stocked_product(stub, 5000)  # enough rows that a scan would cost more
    await cp_pool.execute("ANALYZE codes")
    # codes_available leads with the merchant (issue 14); RESERVE names it (from the product row)
    plan = "\n".join(r[0] for r in await cp_pool.fetch(
        "EXPLAIN SELECT id FROM codes WHERE merchant_id = (SELECT merchant_id FROM products WHERE id = $1) "
        "AND product_id = $1 AND status = 'available' "
        "ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED", uuid.UUID(product_id)))
    assert "codes_available" in plan, plan
    assert "Sort" not in plan, plan
