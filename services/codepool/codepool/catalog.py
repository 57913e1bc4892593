"""Products, stock and reading codes: the staff list (masked), the admin reveal (audited, counted)
and the buyer's own delivered codes ("Reading codes").

Merchants (docs/tenancy.md, "The code pool"): a staff or admin caller reads and writes only its
own merchant's products and codes, filtered in SQL (`merchant` parameters: the caller's merchant,
or NULL for any) inside `tenancy.scoped` (Row-Level Security as the second line); another
merchant's product or code is NOT_FOUND, worded as a missing one. The platform's operator reads
stock and masked codes of any merchant, and each such read is audited (`operator_read`) in the
merchant it read, in the same transaction."""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import asyncpg
import grpc

from cutylib import tenancy
from cutylib.db import UnitOfWork, reports
from cutylib.errors import AlreadyExists, DomainError, FailedPrecondition, NotFound
from cutylib.principal import Principal
from cutylib.telemetry import set_span_attributes

from . import domain, metrics
from .keys import CodeIntegrityError, Keyring

log = logging.getLogger("codepool.catalog")

PRODUCT_COLUMNS = "id, merchant_id, sku, name, price_minor, currency, low_stock_threshold, claim_quarantine_threshold"
CREATE_PRODUCT = f"""
INSERT INTO products (id, merchant_id, sku, name, price_minor, currency, low_stock_threshold)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING {PRODUCT_COLUMNS}
"""
# $2: the caller's merchant, NULL for any (tenancy.merchant_filter).
GET_PRODUCT = f"SELECT {PRODUCT_COLUMNS} FROM products WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)"

# The product's counter rows (product_stock, kept by the statements that change its codes), summed:
# a few rows whatever the number of codes. One statement, so the three come from one snapshot and
# always add up.
STOCK = """
SELECT p.id, p.merchant_id,
       coalesce(sum(s.available), 0)::bigint AS available,
       coalesce(sum(s.reserved), 0)::bigint AS reserved,
       coalesce(sum(s.delivered), 0)::bigint AS delivered,
       coalesce(sum(s.quarantined), 0)::bigint AS quarantined,
       coalesce(sum(s.revoked), 0)::bigint AS revoked
FROM products p LEFT JOIN product_stock s ON s.merchant_id = p.merchant_id AND s.product_id = p.id
WHERE p.id = $1 AND ($2::text IS NULL OR p.merchant_id = $2)
GROUP BY p.id
"""

# Keyset page of one product's codes (codes_merchant_product_id_key); $1 the product's own merchant.
LIST_CODES = """
SELECT id, product_id, status, key_id, nonce, ciphertext FROM codes
WHERE merchant_id = $1 AND product_id = $2 AND id > $3
ORDER BY id LIMIT $4
"""

GET_CODE = """
SELECT id, merchant_id, product_id, status, key_id, nonce, ciphertext FROM codes
WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)
"""

# A code's merchant and product come from its row.
COUNT_VIEW = """
INSERT INTO code_views (merchant_id, product_id, code_id, views, last_viewed_at)
SELECT c.merchant_id, c.product_id, c.id, 1, clock_timestamp() FROM codes c WHERE c.id = $1
ON CONFLICT (merchant_id, code_id) DO UPDATE SET views = code_views.views + 1, last_viewed_at = clock_timestamp()
RETURNING views
"""

# Every plaintext read of delivered codes by their buyer is counted per code.
COUNT_VIEWS = """
INSERT INTO code_views (merchant_id, product_id, code_id, views, last_viewed_at)
SELECT c.merchant_id, c.product_id, c.id, 1, clock_timestamp() FROM codes c WHERE c.id = ANY($1::uuid[])
ON CONFLICT (merchant_id, code_id) DO UPDATE SET views = code_views.views + 1, last_viewed_at = clock_timestamp()
"""

AUDIT_BUYER_READ = """
INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
SELECT r.merchant_id, $1, 'read_delivered', r.product_id, r.order_id, $3::uuid[],
       jsonb_build_object('customer_id', $4::text)
FROM reservations_all r WHERE r.order_id = $2 LIMIT 1
"""

AUDIT_REVEAL = """
INSERT INTO audit_log (merchant_id, actor, action, product_id, code_ids)
SELECT c.merchant_id, $1, 'reveal', c.product_id, ARRAY[c.id] FROM codes c WHERE c.id = $2
"""

# An operator's read of a merchant's stock or codes: who (subject and role), what.
AUDIT_OPERATOR_READ = """
INSERT INTO audit_log (merchant_id, actor, action, product_id, code_ids, details)
SELECT p.merchant_id, $1, 'operator_read', p.id, $3::uuid[],
       jsonb_build_object('rpc', $4::text, 'subject', $5::text, 'role', $6::text)
FROM products p WHERE p.id = $2
"""

# The buyer reads their codes whenever they like, also once the order has moved into the order
# history (docs/codepool.md, "Retention"): the *_all views hold both, the live row first.
ORDER_OWNER = "SELECT customer_id, status FROM reservations_all WHERE order_id = $1 LIMIT 1"

DELIVERED_CODES = """
SELECT c.id, c.product_id, c.key_id, c.nonce, c.ciphertext
FROM reservations_all r
JOIN deliveries_all d ON d.merchant_id = r.merchant_id AND d.order_id = r.order_id
JOIN codes c ON c.id = d.code_id
WHERE r.order_id = $1 AND d.status = 'delivered'
ORDER BY c.id
"""


class CodeDamaged(DomainError):
    """A stored code fails authentication: never served, reported as data loss."""
    code = grpc.StatusCode.DATA_LOSS


@dataclass(frozen=True)
class Product:
    id: str
    sku: str
    name: str
    price_minor: int
    currency: str
    merchant_id: str = ""
    low_stock_threshold: int = domain.DEFAULT_LOW_STOCK_THRESHOLD
    claim_quarantine_threshold: int | None = None  # docs/codepool.md, "Batch quarantine"

    @classmethod
    def from_row(cls, r) -> "Product":
        return cls(str(r["id"]), r["sku"], r["name"], r["price_minor"], r["currency"], r["merchant_id"],
                   r["low_stock_threshold"], r["claim_quarantine_threshold"])


def _is_operator(p: Principal) -> bool:
    return p.role == tenancy.OPERATOR_ROLE


class Catalog:
    def __init__(self, pool: asyncpg.Pool, keyring: Keyring):
        self.pool = pool
        self.keyring = keyring

    def plain(self, row) -> str:
        """A code row's value (id, product_id, key_id, nonce, ciphertext); a damaged one is never served."""
        return self._plain(row)

    def _plain(self, row) -> str:
        try:
            return self.keyring.decrypt(row["id"].bytes, row["product_id"].bytes, row["key_id"], row["nonce"],
                                        row["ciphertext"])
        except CodeIntegrityError as e:
            # Which key and why is for the log (with the trace id); the caller learns only that it failed.
            log.error("code failed its integrity check", extra={"code_id": str(row["id"]), "error": str(e)})
            raise CodeDamaged(f"code {row['id']} failed its integrity check and is not served",
                              reason="code-integrity") from None

    async def create_product(self, p: Principal, sku: str, name: str, currency: str, amount_minor: int,
                             low_stock_threshold: int = domain.DEFAULT_LOW_STOCK_THRESHOLD) -> Product:
        """A product of the admin's own merchant; its sku is unique within that merchant."""
        merchant = tenancy.owning_merchant(p)
        try:
            async with tenancy.scoped(self.pool, p) as uow:
                row = await uow.conn.fetchrow(CREATE_PRODUCT, uuid.uuid4(), merchant, sku, name, amount_minor, currency,
                                              low_stock_threshold)
                await uow.commit()
        except asyncpg.UniqueViolationError:
            raise AlreadyExists(f"a product with sku {sku!r} exists", reason="sku-taken") from None
        return Product.from_row(row)

    async def stock(self, p: Principal, product_id: uuid.UUID, actor: str):
        async with tenancy.scoped(self.pool, p) as uow:
            row = await uow.conn.fetchrow(STOCK, product_id, tenancy.merchant_filter(p))
            if row is None:
                raise NotFound(f"no product {product_id}")
            if _is_operator(p):
                await uow.conn.execute(AUDIT_OPERATOR_READ, actor, product_id, None, "GetStock", p.subject, p.role)
            await uow.commit()
        return row

    async def list_codes(self, p: Principal, product_id: uuid.UUID, after: uuid.UUID, limit: int, actor: str):
        """[(id, status, masked value)] in id order, and the next page's cursor (None on the last page)."""
        async with tenancy.scoped(reports(self.pool), p) as uow:  # a report: its own pool
            product = await uow.conn.fetchrow(GET_PRODUCT, product_id, tenancy.merchant_filter(p))
            if product is None:
                raise NotFound(f"no product {product_id}")
            rows = await uow.conn.fetch(LIST_CODES, product["merchant_id"], product_id, after, limit)
            items = [(str(r["id"]), r["status"], domain.mask(self._plain(r))) for r in rows]
            if _is_operator(p):
                await uow.conn.execute(AUDIT_OPERATOR_READ, actor, product_id, [r["id"] for r in rows], "ListCodes",
                                       p.subject, p.role)
            await uow.commit()
        return items, (rows[-1]["id"] if len(rows) == limit else None)

    async def reveal(self, p: Principal, code_id: uuid.UUID, actor: str) -> tuple[str, int]:
        """An admin sees one code of its own merchant; the view is counted and audited in the same
        transaction. Another merchant's code is NOT_FOUND, as a missing one."""
        async with tenancy.scoped(self.pool, p) as uow:
            row = await uow.conn.fetchrow(GET_CODE, code_id, tenancy.merchant_filter(p))
            if row is None:
                raise NotFound(f"no code {code_id}")
            value = self._plain(row)
            views = await uow.conn.fetchval(COUNT_VIEW, code_id)
            await uow.conn.execute(AUDIT_REVEAL, actor, code_id)
            await uow.commit()
        metrics.REGISTRY.reveals.inc()
        return value, views

    async def delivered_codes(self, order_id: str, customer_id: str, actor: str) -> list[tuple[str, str]]:
        """The plaintext of an order's codes, for its own customer and only once delivered.
        Another customer's order answers NOT_FOUND: existence is not leaked. Every read is audited
        (`read_delivered`, with the codes and who asked) and counted per code, in the transaction
        that reads them: no plaintext leaves without its record."""
        set_span_attributes(order_id=order_id)
        owner = await self.pool.fetchrow(ORDER_OWNER, order_id)
        if owner is None or owner["customer_id"] != customer_id:
            raise NotFound(f"no order {order_id} for this customer")
        if owner["status"] != domain.DELIVERED:
            raise FailedPrecondition(f"order {order_id} is {owner['status']}, not delivered", reason="not-delivered")
        async with UnitOfWork(self.pool) as uow:
            rows = await uow.conn.fetch(DELIVERED_CODES, order_id)
            codes = [(str(r["id"]), self._plain(r)) for r in rows]
            if rows:
                ids = [r["id"] for r in rows]
                await uow.conn.execute(COUNT_VIEWS, ids)
                await uow.conn.execute(AUDIT_BUYER_READ, actor, order_id, ids, customer_id)
            await uow.commit()
        metrics.REGISTRY.buyer_reads.inc(len(codes))
        return codes
