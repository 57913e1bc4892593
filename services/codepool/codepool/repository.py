"""SQL of reservations, deliveries and payment transactions, as named statements.

Each statement either runs after the order's reservation row is locked (`LOCK_RESERVATION`) or
guards itself with a conditional `WHERE status = ...`, so a concurrent actor never makes one apply
twice; codes are taken with `FOR UPDATE SKIP LOCKED` so buyers never queue on the same row.
"""
from __future__ import annotations

import uuid

import asyncpg

from cutylib.db import sets_its_merchant

# Codes are taken oldest first, `ORDER BY seq`, an order only the partial index codes_available
# yields for available codes (migrations/0001_baseline.sql says why that matters);
# tests/integration/codepool/test_codepool_schema.py and `make bench-codepool` check the plan.

# The hot path, one autocommit statement (the function codepool_reserve, which sets the merchant
# for its call, migrations/functions/codepool_reserve.sql): the order's row, the next free codes (skipping rows other
# buyers hold), their deliveries and the audit entry. Returns no row when the reservation already
# exists (a replay) or the product is unknown. When fewer codes than ordered could be taken it
# raises SQLSTATE CP001 (codepool_short_stock), which undoes the whole statement: all or nothing.
# The merchant comes from the product row: the reservation, its deliveries and its audit
# entry take it from there, and the code scan names it, as codes_available leads with it. The
# scalar subquery `(SELECT merchant_id FROM r)` is a parameter of the index scan (an InitPlan), so
# the scan still yields `seq` order with no sort; no reservation inserted (a replay) -> NULL -> no codes.
RESERVE = sets_its_merchant("""
SELECT (x.reservation).*, x.code_ids
FROM codepool_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9) x
""")

SHORT_STOCK = "CP001"
TOO_MANY_RESERVATIONS = "CP002"   # the customer's live reservations are at CUTY_MAX_ACTIVE_RESERVATIONS
QUANTITY_CAP = "CP003"            # ... or this one would pass CUTY_MAX_QUANTITY_PER_PRODUCT codes of the product


def _with_codes(reservations: str, deliveries: str, where: str) -> str:
    """A reservation row of `reservations` with the codes it holds (in `deliveries`; none once
    released: they are back in stock), as `code_ids`."""
    return f"""
SELECT r.*, (SELECT array_agg(d.code_id ORDER BY d.code_id) FROM {deliveries} d
             WHERE d.merchant_id = r.merchant_id AND d.order_id = r.order_id AND d.status = r.status
               AND r.status <> 'released') AS code_ids
FROM {reservations} r {where}
"""


# A reservation with the codes it holds now.
GET_RESERVATION = _with_codes("reservations", "deliveries", "WHERE r.order_id = $1")

# The stored reservation a non-inserting RESERVE collided with: this request's own, else the other.
# The order item id is unique within the product's merchant (reservations_merchant_order_item_key).
FIND_COLLISION = _with_codes("reservations", "deliveries", """
WHERE r.order_id = $1 OR (r.merchant_id = (SELECT p.merchant_id FROM products p WHERE p.id = $3) AND r.order_item_id = $2)
ORDER BY (r.order_id = $1 AND r.order_item_id = $2) DESC
LIMIT 1""")

LOCK_RESERVATION = "SELECT * FROM reservations WHERE order_id = $1 FOR UPDATE"

# An order that finished long ago and moved into the order history (docs/codepool.md, "Retention"),
# with the codes it held then: read-only, found only where the live table has no such order.
GET_MOVED = _with_codes("reservations_history", "deliveries_history", "WHERE r.order_id = $1")

# A payment transaction of the merchant, live or moved with its order.
GET_ANY_TRANSACTION = """
SELECT order_id, outcome, reason FROM payment_transactions_all WHERE merchant_id = $2 AND transaction_id = $1
"""

# The product's available codes, from its counter rows (product_stock): what the OutOfStock answer says.
COUNT_AVAILABLE = """
SELECT codepool_stock_available(p.merchant_id, p.id) FROM products p WHERE p.id = $1
"""

PRODUCT_EXISTS = "SELECT EXISTS (SELECT FROM products WHERE id = $1)"

# A late payment for a released reservation takes the order up again, with fresh codes.
REOPEN = """
UPDATE reservations
SET status = 'reserved', reserved_at = clock_timestamp(), expires_at = clock_timestamp() + make_interval(secs => $2),
    released_at = NULL, release_reason = NULL
WHERE order_id = $1 AND status = 'released'
"""

# The merchant ($6) is the locked reservation row's (the deliveries' foreign key holds it to it).
TAKE_CODES = """
WITH picked AS (
    SELECT id FROM codes WHERE merchant_id = $6 AND product_id = $3 AND status = 'available'
    ORDER BY seq LIMIT $5 FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE codes c SET status = 'reserved' FROM picked WHERE c.id = picked.id RETURNING c.id
), d AS (
    INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status)
    SELECT $6, $1, $2, $3, $4, taken.id, 'reserved' FROM taken
    RETURNING code_id
)
SELECT coalesce(array_agg(code_id ORDER BY code_id), '{}') FROM d
"""

# A payment callback is acted on once: the first writer of the transaction id wins; a concurrent
# duplicate waits on the unique index and then finds it. The key is (merchant, transaction id); the
# merchant is the order's, taken from its reservation row.
CLAIM_TRANSACTION = """
INSERT INTO payment_transactions (merchant_id, transaction_id, order_id, outcome)
SELECT r.merchant_id, $1, r.order_id, 'delivered' FROM reservations r WHERE r.order_id = $2
ON CONFLICT (merchant_id, transaction_id) DO NOTHING
RETURNING transaction_id
"""

GET_TRANSACTION = """
SELECT order_id, outcome, reason FROM payment_transactions WHERE merchant_id = $2 AND transaction_id = $1
"""

REJECT_TRANSACTION = """
UPDATE payment_transactions SET outcome = 'rejected', reason = $2 WHERE merchant_id = $3 AND transaction_id = $1
"""

DELIVER = """
WITH d AS (
    UPDATE deliveries SET status = 'delivered', delivered_at = clock_timestamp()
    WHERE merchant_id = $4 AND order_id = $1 AND status = 'reserved'
    RETURNING code_id
), c AS (
    UPDATE codes SET status = 'delivered' FROM d WHERE codes.id = d.code_id AND codes.status = 'reserved'
    RETURNING codes.id
), r AS (
    UPDATE reservations SET status = 'delivered', delivered_at = clock_timestamp(), payment_transaction_id = $2
    WHERE order_id = $1 AND status = 'reserved'
    RETURNING merchant_id, product_id, quantity
), a AS (
    INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
    SELECT r.merchant_id, $3, 'deliver', r.product_id, $1, (SELECT array_agg(code_id ORDER BY code_id) FROM d),
           jsonb_build_object('payment_transaction_id', $2::text)
    FROM r
)
SELECT (SELECT count(*) FROM d) AS deliveries, (SELECT count(*) FROM c) AS codes,
       (SELECT quantity FROM r) AS quantity
"""

# Release reservations (locked by the caller) and put their codes back; `$2` is why: released or expired.
RELEASE = """
WITH r AS (
    UPDATE reservations SET status = 'released', released_at = clock_timestamp(), release_reason = $2
    WHERE order_id = ANY($1::text[]) AND status = 'reserved'
    RETURNING merchant_id, order_id, product_id
), d AS (
    UPDATE deliveries d SET status = 'released', released_at = clock_timestamp()
    FROM r WHERE d.merchant_id = r.merchant_id AND d.order_id = r.order_id AND d.status = 'reserved'
    RETURNING d.order_id, d.code_id
), c AS (
    UPDATE codes SET status = 'available' FROM d WHERE codes.id = d.code_id AND codes.status = 'reserved'
    RETURNING codes.id
), a AS (
    -- Each reservation's codes grouped once (a lookup in d per reservation made a batch cost its square).
    INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids)
    SELECT r.merchant_id, $3, CASE $2 WHEN 'expired' THEN 'expire' ELSE 'release' END, r.product_id, r.order_id,
           g.code_ids
    FROM r LEFT JOIN (SELECT d.order_id, array_agg(d.code_id ORDER BY d.code_id) AS code_ids FROM d
                      GROUP BY d.order_id) g ON g.order_id = r.order_id
)
SELECT (SELECT count(*) FROM r) AS reservations, (SELECT count(*) FROM d) AS deliveries,
       (SELECT count(*) FROM c) AS codes
"""

# The sweeper's batch: due reservations no other replica is working on.
CLAIM_EXPIRED = """
SELECT order_id FROM reservations
WHERE status = 'reserved' AND expires_at <= clock_timestamp()
ORDER BY expires_at
LIMIT $1
FOR UPDATE SKIP LOCKED
"""

# The entry's merchant is its order's (every caller names one).
AUDIT = """
INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
SELECT r.merchant_id, $1, $2, $3, r.order_id, $5, $6 FROM reservations r WHERE r.order_id = $4
"""


class Reservations:
    """The statements above, bound to one connection (one unit of work)."""

    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def reserve(self, cmd, ttl_seconds: float, actor: str, *, max_active: int, max_quantity: int):
        """The RESERVE row, or None for a replay / unknown product; asyncpg.PostgresError with
        sqlstate SHORT_STOCK when the stock is short, TOO_MANY_RESERVATIONS / QUANTITY_CAP when the
        customer is at a cap (nothing was written)."""
        return await self.conn.fetchrow(RESERVE, cmd.order_id, cmd.order_item_id, cmd.product_id, cmd.customer_id,
                                        cmd.quantity, float(ttl_seconds), actor, max_active, max_quantity)

    async def get(self, order_id: str):
        return await self.conn.fetchrow(GET_RESERVATION, order_id)

    async def find_collision(self, order_id: str, order_item_id: str, product_id: uuid.UUID):
        return await self.conn.fetchrow(FIND_COLLISION, order_id, order_item_id, product_id)

    async def get_moved(self, order_id: str):
        return await self.conn.fetchrow(GET_MOVED, order_id)

    async def get_any_transaction(self, transaction_id: str, merchant_id: str):
        return await self.conn.fetchrow(GET_ANY_TRANSACTION, transaction_id, merchant_id)

    async def lock(self, order_id: str):
        return await self.conn.fetchrow(LOCK_RESERVATION, order_id)

    async def count_available(self, product_id: uuid.UUID) -> int:
        return await self.conn.fetchval(COUNT_AVAILABLE, product_id)

    async def product_exists(self, product_id: uuid.UUID) -> bool:
        return await self.conn.fetchval(PRODUCT_EXISTS, product_id)

    async def reopen(self, order_id: str, ttl_seconds: float) -> None:
        await self.conn.execute(REOPEN, order_id, float(ttl_seconds))

    async def take_codes(self, row) -> list:
        return list(await self.conn.fetchval(TAKE_CODES, row["order_id"], row["order_item_id"], row["product_id"],
                                             row["customer_id"], row["quantity"], row["merchant_id"]))

    async def claim_transaction(self, transaction_id: str, order_id: str) -> bool:
        return await self.conn.fetchval(CLAIM_TRANSACTION, transaction_id, order_id) is not None

    async def get_transaction(self, transaction_id: str, merchant_id: str):
        return await self.conn.fetchrow(GET_TRANSACTION, transaction_id, merchant_id)

    async def reject_transaction(self, transaction_id: str, reason: str, merchant_id: str) -> None:
        await self.conn.execute(REJECT_TRANSACTION, transaction_id, reason, merchant_id)

    async def deliver(self, order_id: str, transaction_id: str, actor: str, merchant_id: str):
        return await self.conn.fetchrow(DELIVER, order_id, transaction_id, actor, merchant_id)

    async def release(self, order_ids: list[str], reason: str, actor: str):
        return await self.conn.fetchrow(RELEASE, order_ids, reason, actor)

    async def claim_expired(self, limit: int) -> list[str]:
        return [r["order_id"] for r in await self.conn.fetch(CLAIM_EXPIRED, limit)]

    async def audit(self, actor: str, action: str, *, order_id: str, product_id=None, code_ids=None,
                    details: dict | None = None) -> None:
        await self.conn.execute(AUDIT, actor, action, product_id, order_id, code_ids, details or {})
