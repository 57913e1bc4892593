"""The code pool's incident story: everything known about a code, found by whatever support has
(docs/codepool.md, "Incident story").

    story = await look_up(pool, keyring, "<code value | code id | order id>", by="alice")

A value is found through its keyed hash (HMAC-SHA256, the same the duplicate check uses), one
probe of the unique index (merchant, product, code_hash) per product, so no value is ever compared
in clear and no new index on `codes` is needed. Each code found is told with its product, batch,
states and their times, every order it went to (with the reservation's outcome), every read of it
(the buyer's, an admin's reveal, an operator's), and the audit trail of it and its orders.

Reading is itself audited: the facts and an `operator_read` entry per code's product (who, which
command, how it was found) are one transaction, so nothing is shown without its record. Only
masked values are ever shown. `order_evidence` is the code pool's part of a chargeback evidence
document (payments joins it with the payment's timeline: `python -m payments evidence`)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from cutylib.db import UnitOfWork

from . import domain
from .catalog import AUDIT_OPERATOR_READ
from .keys import CodeIntegrityError, Keyring

MAX_CODES = 50  # a query names at most this many codes (an order holds at most 100: the rest are counted)
MAX_ENTRIES = 500  # audit entries per code or order, oldest first

# A value's codes. The products holding it are found first, each by an index-only probe of
# codes_merchant_product_code_hash_key (nothing else answers "is this hash in this product" without
# reading the table); then its code in those few products. As one join, the planner, whose
# (merchant, product) estimates are about one row, read every code to compare hashes (72 ms at
# 70,000 codes and 500 products); the second step may still walk a holding product's codes in
# codes_merchant_product_id_key (the same estimate), which costs in proportion to that product's
# size only (47 ms there, under load; docs/codepool.md, "Incident story").
FIND_BY_HASH = """
SELECT c.id FROM (
    SELECT p.merchant_id, p.id FROM products p
    WHERE EXISTS (SELECT FROM codes c WHERE c.merchant_id = p.merchant_id AND c.product_id = p.id AND c.code_hash = $1)
    LIMIT $2
) holding
JOIN codes c ON c.merchant_id = holding.merchant_id AND c.product_id = holding.id AND c.code_hash = $1
"""

FIND_BY_ID = "SELECT id FROM codes WHERE id = $1"

ORDER = """
SELECT order_id, order_item_id, merchant_id, product_id, customer_id, quantity, unit_price_minor, currency,
       status, reserved_at, expires_at, delivered_at, released_at, release_reason, payment_transaction_id
FROM reservations_all WHERE order_id = $1 LIMIT 1
"""

ORDER_CODES = """
SELECT DISTINCT code_id FROM deliveries_all WHERE merchant_id = $1 AND order_id = $2 LIMIT $3
"""

CODE = """
SELECT c.id, c.merchant_id, c.product_id, c.batch_id, c.status, c.created_at, c.reserved_at, c.delivered_at,
       c.key_id, c.nonce, c.ciphertext, p.sku, p.name AS product_name, b.batch_ref,
       b.actor AS batch_imported_by, b.created_at AS batch_imported_at, v.views, v.last_viewed_at
FROM codes c
JOIN products p ON p.merchant_id = c.merchant_id AND p.id = c.product_id
JOIN supplier_batches b ON b.merchant_id = c.merchant_id AND b.product_id = c.product_id AND b.id = c.batch_id
LEFT JOIN code_views v ON v.merchant_id = c.merchant_id AND v.code_id = c.id
WHERE c.id = $1
"""

# Every order the code went to, in the order it went (indexes deliveries_by_code and
# deliveries_history_by_code: an order that moved into the order history is found there).
DELIVERIES = """
SELECT d.order_id, d.order_item_id, d.customer_id, d.status, d.reserved_at, d.delivered_at, d.released_at,
       r.status AS order_status, r.release_reason, r.payment_transaction_id
FROM deliveries_all d JOIN reservations_all r ON r.merchant_id = d.merchant_id AND r.order_id = d.order_id
WHERE d.merchant_id = $1 AND d.code_id = $2
ORDER BY d.id
LIMIT $3
"""

# The code's audit trail: the entries of its orders that name it (or name no code), by
# audit_log_by_order, and the entries without an order that name it (reveals, operator reads,
# rotations), by audit_log_by_code.
TRAIL = """
SELECT * FROM (
    SELECT id, at, actor, action, product_id, order_id, code_ids, details FROM audit_log
    WHERE merchant_id = $1 AND order_id = ANY($3::text[]) AND order_id IS NOT NULL
      AND (code_ids IS NULL OR code_ids @> ARRAY[$2::uuid])
    UNION ALL
    SELECT id, at, actor, action, product_id, order_id, code_ids, details FROM audit_log
    WHERE merchant_id = $1 AND order_id IS NULL AND code_ids @> ARRAY[$2::uuid]
) t ORDER BY id LIMIT $4
"""

ORDER_TRAIL = """
SELECT id, at, actor, action, product_id, order_id, code_ids, details FROM audit_log
WHERE merchant_id = $1 AND order_id = $2 ORDER BY id LIMIT $3
"""

READS = ("read_delivered", "reveal", "operator_read")


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_iso(v) for v in value]
    return value


def _plain(row, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: _iso(v) for k, v in dict(row).items() if k not in drop}


def _entry(row) -> dict[str, Any]:
    out = _plain(row)
    ids = out.pop("code_ids") or []
    out["codes_named"] = len(ids)  # a rotation names thousands: the count, not the list
    return out


@dataclass
class CodeStory:
    code: dict[str, Any]
    deliveries: list[dict[str, Any]]
    reads: list[dict[str, Any]]
    trail: list[dict[str, Any]]


@dataclass
class Story:
    query: str
    matched: str  # "code value" | "code id" | "order id" | "" (nothing)
    order: dict[str, Any] | None = None
    codes: list[CodeStory] = field(default_factory=list)
    more_codes: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query if self.matched != "code value" else "(a code value)",
                "matched": self.matched, "order": self.order, "more_codes": self.more_codes,
                "codes": [{**c.code, "deliveries": c.deliveries, "reads": c.reads, "trail": c.trail}
                          for c in self.codes]}


def _masked(keyring: Keyring, row) -> str:
    try:
        return domain.mask(keyring.decrypt(row["id"].bytes, row["product_id"].bytes, row["key_id"],
                                           row["nonce"], row["ciphertext"]))
    except CodeIntegrityError:
        return "(damaged: does not decrypt under its key)"


async def _code_story(conn, keyring: Keyring, code_id: uuid.UUID) -> CodeStory:
    row = await conn.fetchrow(CODE, code_id)
    code = _plain(row, drop=("nonce", "ciphertext"))
    code["masked_value"] = _masked(keyring, row)
    deliveries = [_plain(d) for d in await conn.fetch(DELIVERIES, row["merchant_id"], code_id, MAX_ENTRIES)]
    orders = [d["order_id"] for d in deliveries]
    trail = [_entry(e) for e in await conn.fetch(TRAIL, row["merchant_id"], code_id, orders, MAX_ENTRIES)]
    return CodeStory(code, deliveries, [e for e in trail if e["action"] in READS], trail)


async def _find(conn, keyring: Keyring, query: str) -> tuple[str, dict | None, list[uuid.UUID], bool]:
    """(what matched, the order, its codes or the code(s), whether more codes than MAX_CODES)."""
    try:
        code_id = uuid.UUID(query)
    except ValueError:
        code_id = None
    if code_id is not None and await conn.fetchval(FIND_BY_ID, code_id):
        return "code id", None, [code_id], False
    order = await conn.fetchrow(ORDER, query) if len(query) <= 128 else None
    if order is not None:
        ids = [r["code_id"] for r in await conn.fetch(ORDER_CODES, order["merchant_id"], query, MAX_CODES + 1)]
        return "order id", _plain(order), ids[:MAX_CODES], len(ids) > MAX_CODES
    ids = [r["id"] for r in await conn.fetch(FIND_BY_HASH, keyring.code_hash(query), MAX_CODES + 1)]
    return ("code value" if ids else ""), None, ids[:MAX_CODES], len(ids) > MAX_CODES


async def look_up(pool, keyring: Keyring, query: str, *, by: str, command: str = "ops code") -> Story:
    """The story of `query` (a code value, a code id or an order id), its reading audited per code
    found (`operator_read`: by whom, which command, how it was found) in the same transaction."""
    query = query.strip()
    async with UnitOfWork(pool) as uow:
        matched, order, ids, more = await _find(uow.conn, keyring, query)
        story = Story(query, matched, order, [await _code_story(uow.conn, keyring, i) for i in ids], more)
        await _audit(uow.conn, story, by=by, command=f"{command} (by {matched or 'nothing'})")
        await uow.commit()
    return story


async def order_evidence(pool, keyring: Keyring, order_id: str, *, by: str) -> dict[str, Any] | None:
    """The code pool's part of an order's chargeback evidence, or None for an unknown order: the
    reservation, each code (masked) with its deliveries and reads, and the order's audit trail.
    Audited like `look_up`."""
    async with UnitOfWork(pool) as uow:
        order = await uow.conn.fetchrow(ORDER, order_id)
        if order is None:
            return None
        ids = [r["code_id"] for r in await uow.conn.fetch(ORDER_CODES, order["merchant_id"], order_id, MAX_CODES + 1)]
        story = Story(order_id, "order id", _plain(order),
                      [await _code_story(uow.conn, keyring, i) for i in ids[:MAX_CODES]], len(ids) > MAX_CODES)
        trail = [_entry(e) for e in await uow.conn.fetch(ORDER_TRAIL, order["merchant_id"], order_id, MAX_ENTRIES)]
        await _audit(uow.conn, story, by=by, command="chargeback evidence")
        await uow.commit()
    out = story.to_json()
    out["order_trail"] = trail
    return out


async def _audit(conn, story: Story, *, by: str, command: str) -> None:
    """One `operator_read` entry per product whose codes were shown (in that product's merchant)."""
    by_product: dict[str, list[str]] = {}
    for c in story.codes:
        by_product.setdefault(c.code["product_id"], []).append(c.code["id"])
    if story.order is not None and not by_product:
        by_product[story.order["product_id"]] = []
    for product_id, code_ids in by_product.items():
        await conn.execute(AUDIT_OPERATOR_READ, f"ops:{by}", uuid.UUID(product_id),
                           [uuid.UUID(i) for i in code_ids], command, by, "operator")
