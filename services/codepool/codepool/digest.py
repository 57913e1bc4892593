"""The invariant auditor's digest of the code pool (payments' auditor, docs/codepool.md, "The
auditor's digest"): per order reserved in a time window and delivered, how many of its deliveries
are delivered now, how many were revoked after a claim and how many claims a replacement resolved;
and every code of those orders that went to more than one order (a code sold twice). One keyset
page per call, over the partial index reservations_digest (migration 0100) and its twin on the
order history (reservations_history_digest, 0270): orders that moved are audited as the live ones."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cutylib import paging
from cutylib.db import reports

DEFAULT_PAGE = 1000
MAX_PAGE = 5000
MAX_WINDOW_SECONDS = 86400.0

ORDERS = """
SELECT r.order_id, r.merchant_id, r.product_id, r.quantity, r.payment_transaction_id, r.reserved_at,
       d.delivered, d.revoked, c.replaced
FROM reservations_all r
CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE x.status = 'delivered') AS delivered,
                           count(*) FILTER (WHERE x.status = 'revoked') AS revoked
                    FROM deliveries_all x WHERE x.merchant_id = r.merchant_id AND x.order_id = r.order_id) d
CROSS JOIN LATERAL (SELECT count(*) AS replaced FROM code_claims k
                    WHERE k.merchant_id = r.merchant_id AND k.order_id = r.order_id AND k.status = 'replaced') c
WHERE r.status = 'delivered' AND r.reserved_at >= $1 AND r.reserved_at < $2
  AND ($3::timestamptz IS NULL OR (r.reserved_at, r.order_id) > ($3, $4::text))
ORDER BY r.reserved_at, r.order_id
LIMIT $5"""

# The codes of these orders (merchant, order pairs) that were delivered to another order too: a
# code sold twice, whatever the unique index on active deliveries says (it holds one per code only
# while that constraint stands, and a revoked delivery is outside it).
DUPLICATES = """
WITH mine AS (SELECT DISTINCT x.merchant_id, x.code_id
              FROM unnest($1::text[], $2::text[]) AS o (merchant_id, order_id)
              JOIN deliveries_all x ON x.merchant_id = o.merchant_id AND x.order_id = o.order_id
              WHERE x.status IN ('delivered', 'revoked'))
SELECT m.merchant_id, m.code_id, array_agg(DISTINCT y.order_id ORDER BY y.order_id) AS order_ids
FROM mine m JOIN deliveries_all y ON y.merchant_id = m.merchant_id AND y.code_id = m.code_id
WHERE y.status IN ('delivered', 'revoked')
GROUP BY m.merchant_id, m.code_id
HAVING count(DISTINCT y.order_id) > 1"""


@dataclass(frozen=True)
class OrderDigest:
    order_id: str
    merchant_id: str
    product_id: str
    quantity: int
    delivered: int
    revoked: int
    replaced: int
    payment_transaction_id: str
    reserved_at: datetime


@dataclass(frozen=True)
class Duplicate:
    code_id: str
    merchant_id: str
    order_ids: list[str]


async def digest_deliveries(pool, start: datetime, end: datetime, page_size: int,
                            page_token: str) -> tuple[list[OrderDigest], list[Duplicate], str]:
    """One page of the window's delivered orders, the duplicates among their codes, and the token
    of the next page ('' on the last)."""
    size = paging.page_size(page_size, default=DEFAULT_PAGE, maximum=MAX_PAGE)
    query = paging.query_fingerprint("DigestDeliveries", start.isoformat(), end.isoformat())
    after = paging.decode_keyset_text(page_token, query)
    at, last = after if after else (None, None)
    db = reports(pool)
    rows = await db.fetch(ORDERS, start, end, at, last, size + 1)
    more = len(rows) > size
    rows = rows[:size]
    orders = [OrderDigest(r["order_id"], r["merchant_id"], str(r["product_id"]), r["quantity"], r["delivered"],
                          r["revoked"], r["replaced"], r["payment_transaction_id"] or "", r["reserved_at"])
              for r in rows]
    duplicates = []
    if rows:
        dup = await db.fetch(DUPLICATES, [r["merchant_id"] for r in rows], [r["order_id"] for r in rows])
        duplicates = [Duplicate(str(d["code_id"]), d["merchant_id"], list(d["order_ids"])) for d in dup]
    token = paging.encode_keyset_text(query, rows[-1]["reserved_at"], rows[-1]["order_id"]) if more else ""
    return orders, duplicates, token
