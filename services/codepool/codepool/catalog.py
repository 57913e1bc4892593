"""Products, stock and reading codes: the staff list (masked), the admin reveal (audited, counted)
and the buyer's own delivered codes (issue 3, "Reading codes")."""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import asyncpg
import grpc

from cutylib.db import UnitOfWork
from cutylib.errors import AlreadyExists, DomainError, FailedPrecondition, NotFound
from cutylib.telemetry import set_span_attributes

from . import domain, metrics
from .keys import CodeIntegrityError, Keyring

log = logging.getLogger("codepool.catalog")

CREATE_PRODUCT = """
INSERT INTO products (id, sku, name, price_minor, currency) VALUES ($1, $2, $3, $4, $5)
RETURNING id, sku, name, price_minor, currency
"""
GET_PRODUCT = "SELECT id, sku, name, price_minor, currency FROM products WHERE id = $1"

# One statement, so the three counts come from one snapshot and always add up.
STOCK = """
SELECT p.id,
       count(c.id) FILTER (WHERE c.status = 'available') AS available,
       count(c.id) FILTER (WHERE c.status = 'reserved')  AS reserved,
       count(c.id) FILTER (WHERE c.status = 'delivered') AS delivered
FROM products p LEFT JOIN codes c ON c.product_id = p.id
WHERE p.id = $1
GROUP BY p.id
"""

LIST_CODES = """
SELECT id, product_id, status, key_id, nonce, ciphertext FROM codes
WHERE product_id = $1 AND id > $2
ORDER BY id LIMIT $3
"""

GET_CODE = "SELECT id, product_id, status, key_id, nonce, ciphertext FROM codes WHERE id = $1"

COUNT_VIEW = """
INSERT INTO code_views (code_id, views, last_viewed_at) VALUES ($1, 1, clock_timestamp())
ON CONFLICT (code_id) DO UPDATE SET views = code_views.views + 1, last_viewed_at = clock_timestamp()
RETURNING views
"""

# Every plaintext read of delivered codes by their buyer is counted per code (issue 10, item 12).
COUNT_VIEWS = """
INSERT INTO code_views (code_id, views, last_viewed_at)
SELECT id, 1, clock_timestamp() FROM unnest($1::uuid[]) AS id
ON CONFLICT (code_id) DO UPDATE SET views = code_views.views + 1, last_viewed_at = clock_timestamp()
"""

AUDIT_BUYER_READ = """
INSERT INTO audit_log (actor, action, product_id, order_id, code_ids, details)
VALUES ($1, 'read_delivered', $2, $3, $4::uuid[], jsonb_build_object('customer_id', $5::text))
"""

AUDIT_REVEAL = """
INSERT INTO audit_log (actor, action, product_id, code_ids) VALUES ($1, 'reveal', $2, ARRAY[$3::uuid])
"""

ORDER_OWNER = "SELECT customer_id, status FROM reservations WHERE order_id = $1"

DELIVERED_CODES = """
SELECT c.id, c.product_id, c.key_id, c.nonce, c.ciphertext
FROM deliveries d JOIN codes c ON c.id = d.code_id
WHERE d.order_id = $1 AND d.status = 'delivered'
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

    @classmethod
    def from_row(cls, r) -> "Product":
        return cls(str(r["id"]), r["sku"], r["name"], r["price_minor"], r["currency"])


class Catalog:
    def __init__(self, pool: asyncpg.Pool, keyring: Keyring):
        self.pool = pool
        self.keyring = keyring

    def _plain(self, row) -> str:
        try:
            return self.keyring.decrypt(row["id"].bytes, row["product_id"].bytes, row["key_id"], row["nonce"],
                                        row["ciphertext"])
        except CodeIntegrityError as e:
            # Which key and why is for the log (with the trace id); the caller learns only that it failed.
            log.error("code failed its integrity check", extra={"code_id": str(row["id"]), "error": str(e)})
            raise CodeDamaged(f"code {row['id']} failed its integrity check and is not served",
                              reason="code-integrity") from None

    async def create_product(self, sku: str, name: str, currency: str, amount_minor: int) -> Product:
        try:
            row = await self.pool.fetchrow(CREATE_PRODUCT, uuid.uuid4(), sku, name, amount_minor, currency)
        except asyncpg.UniqueViolationError:
            raise AlreadyExists(f"a product with sku {sku!r} exists", reason="sku-taken") from None
        return Product.from_row(row)

    async def get_product(self, product_id: uuid.UUID) -> Product:
        row = await self.pool.fetchrow(GET_PRODUCT, product_id)
        if row is None:
            raise NotFound(f"no product {product_id}")
        return Product.from_row(row)

    async def stock(self, product_id: uuid.UUID) -> tuple[int, int, int]:
        row = await self.pool.fetchrow(STOCK, product_id)
        if row is None:
            raise NotFound(f"no product {product_id}")
        return row["available"], row["reserved"], row["delivered"]

    async def list_codes(self, product_id: uuid.UUID, after: uuid.UUID, limit: int):
        """[(id, status, masked value)] in id order, and the next page's cursor (None on the last page)."""
        await self.get_product(product_id)
        rows = await self.pool.fetch(LIST_CODES, product_id, after, limit)
        items = [(str(r["id"]), r["status"], domain.mask(self._plain(r))) for r in rows]
        return items, (rows[-1]["id"] if len(rows) == limit else None)

    async def reveal(self, code_id: uuid.UUID, actor: str) -> tuple[str, int]:
        """An admin sees one code; the view is counted and audited in the same transaction."""
        async with UnitOfWork(self.pool) as uow:
            row = await uow.conn.fetchrow(GET_CODE, code_id)
            if row is None:
                raise NotFound(f"no code {code_id}")
            value = self._plain(row)
            views = await uow.conn.fetchval(COUNT_VIEW, code_id)
            await uow.conn.execute(AUDIT_REVEAL, actor, row["product_id"], code_id)
            await uow.commit()
        metrics.REGISTRY.reveals.inc()
        return value, views

    async def delivered_codes(self, order_id: str, customer_id: str, actor: str) -> list[tuple[str, str]]:
        """The plaintext of an order's codes, for its own customer and only once delivered.
        Another customer's order answers NOT_FOUND: existence is not leaked. Every read is audited
        (`read_delivered`, with the codes and who asked) and counted per code, in the transaction
        that reads them: no plaintext leaves without its record (issue 10, item 12)."""
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
                await uow.conn.execute(AUDIT_BUYER_READ, actor, rows[0]["product_id"], order_id, ids, customer_id)
            await uow.commit()
        metrics.REGISTRY.buyer_reads.inc(len(codes))
        return codes
