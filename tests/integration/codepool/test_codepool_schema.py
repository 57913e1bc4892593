"""The database refuses what the rules forbid, even from hand-written SQL; its functions are the
migrations' function files."""
import itertools
import pathlib
import uuid

import asyncpg
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from codepool import domain

from codepool_testkit import reserve_request, stocked_product

STATUSES = domain.CODE_STATUSES
REPO = pathlib.Path(__file__).resolve().parents[3]
# Where a function of the code pool's database is defined: one file per function, named after it.
FUNCTION_FOLDERS = (REPO / "libs" / "cutylib" / "migrations" / "functions",
                    REPO / "services" / "codepool" / "migrations" / "functions")


async def _code_in(conn, product_id: str, status: str) -> uuid.UUID:
    """A code of the product brought to `status` through the allowed path, in SQL."""
    code_id = await conn.fetchval(
        "SELECT id FROM codes WHERE product_id = $1 AND status = 'available' ORDER BY id LIMIT 1", uuid.UUID(product_id))
    path = {"available": [], "reserved": ["reserved"], "delivered": ["reserved", "delivered"],
            "quarantined": ["quarantined"], "revoked": ["reserved", "delivered", "revoked"]}[status]
    for s in path:
        await conn.execute("UPDATE codes SET status = $2 WHERE id = $1", code_id, s)
    return code_id


async def _refused(conn, sql: str, *args) -> bool:
    """Whether the statement is refused by a status trigger (rolled back either way)."""
    try:
        async with conn.transaction():
            await conn.execute(sql, *args)
    except asyncpg.CheckViolationError as e:
        assert "is not allowed" in str(e), e  # the trigger's refusal, not another constraint's
        return True
    return False


async def test_code_transitions_are_exactly_the_domain_table(stub, cp_pool):
    """Every (from, to) pair of code statuses against the real trigger (codes_guard_update): the
    changes it lets through are domain.CODE_TRANSITIONS, and keeping a status is no transition."""
    product_id, _ = await stocked_product(stub, 20)
    allowed = set()
    async with cp_pool.acquire() as conn:
        for old, new in itertools.product(STATUSES, STATUSES):
            tx = conn.transaction()
            await tx.start()
            try:
                code_id = await _code_in(conn, product_id, old)
                if not await _refused(conn, "UPDATE codes SET status = $2 WHERE id = $1", code_id, new):
                    allowed.add((old, new))
                    assert await conn.fetchval("SELECT status FROM codes WHERE id = $1", code_id) == new
            finally:
                await tx.rollback()
    assert allowed - {(s, s) for s in STATUSES} == domain.CODE_TRANSITIONS
    assert {(s, s) for s in STATUSES} <= allowed


# The columns a reservation in each status must have set (its CHECK constraints), so that only the
# transition trigger can refuse a change of status.
RESERVATION_COLUMNS = {
    "reserved": "delivered_at = NULL, payment_transaction_id = NULL, released_at = NULL, release_reason = NULL",
    "delivered": "delivered_at = now(), payment_transaction_id = 'p', released_at = NULL, release_reason = NULL",
    "released": "delivered_at = NULL, payment_transaction_id = NULL, released_at = now(), release_reason = 'released'",
}


async def test_reservation_transitions_are_exactly_the_domain_table(stub, cp_pool):
    """Every (from, to) pair of reservation statuses against the real trigger (reservations_transition)."""
    product_id, _ = await stocked_product(stub, 1)
    statuses = sorted(RESERVATION_COLUMNS)
    allowed = set()
    async with cp_pool.acquire() as conn:
        merchant_id = await conn.fetchval("SELECT merchant_id FROM products WHERE id = $1", uuid.UUID(product_id))
        for old, new in itertools.product(statuses, statuses):
            tx = conn.transaction()
            await tx.start()
            try:
                order_id = "ord-" + uuid.uuid4().hex
                await conn.execute(
                    "INSERT INTO reservations (merchant_id, order_id, order_item_id, product_id, customer_id, "
                    "quantity, unit_price_minor, currency, status, reserved_at, expires_at) "
                    "VALUES ($1, $2, $2, $3, 'c', 1, 1, 'TRY', 'reserved', now(), now())",
                    merchant_id, order_id, uuid.UUID(product_id))
                # the setup: every status is reserved or one step from it
                await conn.execute(f"UPDATE reservations SET status = '{old}', {RESERVATION_COLUMNS[old]} "
                                   "WHERE order_id = $1", order_id)
                if not await _refused(conn, f"UPDATE reservations SET status = '{new}', {RESERVATION_COLUMNS[new]} "
                                            "WHERE order_id = $1", order_id):
                    allowed.add((old, new))
            finally:
                await tx.rollback()
    assert allowed - {(s, s) for s in statuses} == domain.RESERVATION_TRANSITIONS
    assert {(s, s) for s in statuses} <= allowed


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
    # A row leaves only by moving into the order history (reservations_move): the delete guards
    # refuse the rest (a reservation's deliveries' foreign key refuses it first, while they stay).
    for sql in ("DELETE FROM deliveries WHERE order_id = $1", "DELETE FROM reservations WHERE order_id = $1",
                "DELETE FROM payment_transactions WHERE order_id = $1"):
        with pytest.raises((asyncpg.InsufficientPrivilegeError, asyncpg.ForeignKeyViolationError)):
            await cp_pool.execute(sql, res.order_id)
    for sql in ("DELETE FROM deliveries WHERE order_id = $1", "DELETE FROM payment_transactions WHERE order_id = $1"):
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
    # codes_available leads with the merchant; RESERVE names it (from the product row)
    plan = "\n".join(r[0] for r in await cp_pool.fetch(
        "EXPLAIN SELECT id FROM codes WHERE merchant_id = (SELECT merchant_id FROM products WHERE id = $1) "
        "AND product_id = $1 AND status = 'available' "
        "ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED", uuid.UUID(product_id)))
    assert "codes_available" in plan, plan
    assert "Sort" not in plan, plan


async def test_every_function_is_one_function_file_and_its_body(cp_pool):
    """Every function of the database (none an extension's) has exactly one file in a
    migrations/functions folder, and every file there a function; its body is the file's, so a
    function a versioned migration created or redefined is caught."""
    rows = await cp_pool.fetch("""
        SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public'
          AND NOT EXISTS (SELECT FROM pg_depend d
                          WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')""")
    files = [f for folder in FUNCTION_FOLDERS for f in folder.glob("*.sql")]
    assert sorted(r["proname"] for r in rows) == sorted(f.stem for f in files)
    text = {f.stem: f.read_text() for f in files}
    for r in rows:
        assert r["prosrc"] in text[r["proname"]], f"{r['proname']}: the database's body is not its file's"
