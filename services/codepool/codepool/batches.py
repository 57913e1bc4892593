"""Supplier batches after the sale (docs/codepool.md, "Batch quarantine"): a product's claims
threshold, the batches and their claims, an admin's release or retirement of a quarantined batch,
and the claim export for the supplier.

The quarantine itself is decided by the database when a claim opens (codepool_claim_open ->
codepool_batch_quarantine); release and retirement are one call of codepool_batch_release, under
the batch's advisory lock. Staff and admins see only their merchant's batches (filtered in SQL
inside tenancy.scoped); another merchant's product or batch is NOT_FOUND."""
from __future__ import annotations

import csv
import io
import logging
import uuid

import asyncpg

from cutylib import tenancy
from cutylib.errors import FailedPrecondition, NotFound, ResourceExhausted
from cutylib.principal import Principal

from .catalog import PRODUCT_COLUMNS, Catalog, Product

log = logging.getLogger("codepool.batches")

MAX_BATCHES = 500
MAX_EXPORT_ROWS = 100_000

SET_THRESHOLD = f"""
UPDATE products SET claim_quarantine_threshold = $3 WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)
RETURNING {PRODUCT_COLUMNS}
"""

PRODUCT_MERCHANT = "SELECT merchant_id FROM products WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)"

# Claims counted towards the threshold: open or upheld (not rejected), since the batch's last release.
BATCHES = """
SELECT b.id, b.product_id, b.batch_ref, b.status, b.imported, b.created_at, b.quarantined_at, b.released_at,
       b.retired_at,
       (SELECT count(*) FROM code_claims k
         WHERE k.merchant_id = b.merchant_id AND k.product_id = b.product_id AND k.batch_id = b.id) AS claims,
       (SELECT count(*) FROM code_claims k
         WHERE k.merchant_id = b.merchant_id AND k.product_id = b.product_id AND k.batch_id = b.id
           AND k.status <> 'rejected' AND k.opened_at > coalesce(b.released_at, '-infinity')) AS counted_claims
FROM supplier_batches b
WHERE b.merchant_id = $1 AND b.product_id = $2 AND ($3::uuid IS NULL OR b.id = $3)
ORDER BY b.created_at, b.id
LIMIT $4
"""

DECIDE = "SELECT codepool_batch_release($1, $2, $3, $4, $5, $6)"

EXPORT = """
SELECT k.id AS claim_id, k.status, k.kind, k.reason, k.opened_at, k.opened_by, k.resolved_at, k.resolved_by,
       k.replacement_code_id, k.order_id, b.batch_ref, c.id, c.product_id, c.key_id, c.nonce, c.ciphertext,
       c.delivered_at, c.revoked_at
FROM code_claims k
JOIN supplier_batches b ON b.merchant_id = k.merchant_id AND b.product_id = k.product_id AND b.id = k.batch_id
JOIN codes c ON c.merchant_id = k.merchant_id AND c.product_id = k.product_id AND c.id = k.code_id
WHERE k.merchant_id = $1 AND k.product_id = $2 AND k.batch_id = $3
ORDER BY k.opened_at, k.id
LIMIT $4
"""

AUDIT_EXPORT = """
INSERT INTO audit_log (merchant_id, actor, action, product_id, code_ids, details)
VALUES ($1, $2, 'claims_export', $3, $4::uuid[], jsonb_build_object('batch_id', $5::text, 'rows', $6::int))
"""

EXPORT_COLUMNS = ("claim_id", "claim_status", "kind", "reason", "opened_at", "opened_by", "resolved_at",
                  "resolved_by", "code_id", "code", "batch_ref", "order_id", "delivered_at", "revoked_at",
                  "replacement_code_id")


def _cell(value) -> str:
    """A CSV cell; text a spreadsheet would run as a formula is quoted as text (CSV injection)."""
    if value is None:
        return ""
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


class Batches:
    def __init__(self, pool: asyncpg.Pool, catalog: Catalog):
        self.pool = pool
        self.catalog = catalog

    async def set_threshold(self, p: Principal, product_id: uuid.UUID, threshold: int | None) -> Product:
        async with tenancy.scoped(self.pool, p) as uow:
            row = await uow.conn.fetchrow(SET_THRESHOLD, product_id, tenancy.merchant_filter(p), threshold)
            if row is None:
                raise NotFound(f"no product {product_id}")
            await uow.commit()
        return Product.from_row(row)

    async def _merchant_of(self, conn, p: Principal, product_id: uuid.UUID) -> str:
        merchant = await conn.fetchval(PRODUCT_MERCHANT, product_id, tenancy.merchant_filter(p))
        if merchant is None:
            raise NotFound(f"no product {product_id}")
        return merchant

    async def list(self, p: Principal, product_id: uuid.UUID, batch_id: uuid.UUID | None = None) -> list:
        async with tenancy.scoped(self.pool, p) as uow:
            merchant = await self._merchant_of(uow.conn, p, product_id)
            return await uow.conn.fetch(BATCHES, merchant, product_id, batch_id, MAX_BATCHES)

    async def decide(self, p: Principal, product_id: uuid.UUID, batch_id: uuid.UUID, step: str, actor: str,
                     note: str):
        """Release or retire a quarantined batch: (its row after, codes moved)."""
        async with tenancy.scoped(self.pool, p) as uow:
            merchant = await self._merchant_of(uow.conn, p, product_id)
            moved = await uow.conn.fetchval(DECIDE, merchant, product_id, batch_id, step, actor, note or None)
            rows = await uow.conn.fetch(BATCHES, merchant, product_id, batch_id, 1)
            if not rows:
                raise NotFound(f"no batch {batch_id} of product {product_id}")
            if moved is None:
                raise FailedPrecondition(f"batch {batch_id} is {rows[0]['status']}, not quarantined: only a "
                                         f"quarantined batch is released or retired", reason="batch-not-quarantined")
            await uow.commit()
        log.info("batch decided", extra={"batch_id": str(batch_id), "step": step, "codes": moved})
        return rows[0], moved

    async def export(self, p: Principal, product_id: uuid.UUID, batch_id: uuid.UUID, actor: str) -> tuple[str, int]:
        """The batch's claims as CSV, with each claimed code's value for the supplier: a plaintext
        read, so an admin's only and audited (claims_export, naming every code) in the same
        transaction, like a reveal."""
        async with tenancy.scoped(self.pool, p) as uow:
            merchant = await self._merchant_of(uow.conn, p, product_id)
            if not await uow.conn.fetch(BATCHES, merchant, product_id, batch_id, 1):
                raise NotFound(f"no batch {batch_id} of product {product_id}")
            rows = await uow.conn.fetch(EXPORT, merchant, product_id, batch_id, MAX_EXPORT_ROWS + 1)
            if len(rows) > MAX_EXPORT_ROWS:
                raise ResourceExhausted(f"batch {batch_id} has more than {MAX_EXPORT_ROWS} claims; export refused",
                                        reason="export-too-large")
            out = io.StringIO()
            w = csv.writer(out, lineterminator="\r\n")
            w.writerow(EXPORT_COLUMNS)
            for r in rows:
                w.writerow([_cell(v) for v in (
                    r["claim_id"], r["status"], r["kind"], r["reason"], r["opened_at"], r["opened_by"],
                    r["resolved_at"], r["resolved_by"], r["id"], self.catalog.plain(r), r["batch_ref"],
                    r["order_id"], r["delivered_at"], r["revoked_at"], r["replacement_code_id"])])
            await uow.conn.execute(AUDIT_EXPORT, merchant, actor, product_id, [r["id"] for r in rows], str(batch_id),
                                   len(rows))
            await uow.commit()
        return out.getvalue(), len(rows)
