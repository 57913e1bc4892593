"""The invariant auditor's digest of the code pool (payments' auditor, docs/codepool.md, "The
auditor's digest"): per order reserved in a time window and delivered, how many of its deliveries
are delivered now, how many were revoked after a claim and how many claims a replacement resolved;
and every code of those orders that went to more than one order (a code sold twice). One keyset
page per call, over the partial index reservations_digest (migration 0100) and its twin on the
order history (reservations_history_digest, 0270): orders that moved are audited as the live ones.

`summarize_deliveries` answers the same window per bucket of the order ids' hash (cutylib.digests):
the auditor compares it with its own and pages only the buckets that disagree (`buckets`), so a
window where the books balance moves a few hundred numbers instead of its orders."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cutylib import digests, paging
from cutylib.db import reports

DEFAULT_PAGE = 1000
MAX_PAGE = 5000
MAX_WINDOW_SECONDS = 86400.0

# An order's deliveries, read from its own table: a live order's are live and a moved one's are in
# the history (they leave only with their order). The branch of the other table is skipped as the
# lateral runs (a one-time filter on `r.moved_at`), so an order costs one index probe, where
# deliveries_all would probe the live table and every history partition. `r` is a row of
# reservations_all.
_ORDER_DELIVERIES = """(SELECT merchant_id, order_id, code_id, status FROM deliveries
     WHERE r.moved_at IS NULL AND merchant_id = r.merchant_id AND order_id = r.order_id
     UNION ALL
     SELECT merchant_id, order_id, code_id, status FROM deliveries_history
     WHERE r.moved_at IS NOT NULL AND merchant_id = r.merchant_id AND order_id = r.order_id)"""
_COUNTED = ("count(*) FILTER (WHERE x.status = 'delivered') AS delivered, "
            "count(*) FILTER (WHERE x.status = 'revoked') AS revoked")
# How many of the order's claims a replacement resolved.
_REPLACED = """CROSS JOIN LATERAL (SELECT count(*) AS replaced FROM code_claims k
                    WHERE k.merchant_id = r.merchant_id AND k.order_id = r.order_id AND k.status = 'replaced') c"""
_WINDOW = "r.status = 'delivered' AND r.reserved_at >= $1 AND r.reserved_at < $2"

ORDERS = f"""
SELECT r.order_id, r.merchant_id, r.product_id, r.quantity, r.payment_transaction_id, r.reserved_at,
       d.delivered, d.revoked, c.replaced
FROM reservations_all r
CROSS JOIN LATERAL (SELECT {_COUNTED} FROM {_ORDER_DELIVERIES} x) d
{_REPLACED}
WHERE {_WINDOW}
  AND ($3::timestamptz IS NULL OR (r.reserved_at, r.order_id) > ($3, $4::text))
  AND {digests.in_buckets_sql("r.order_id", "$6", "$7")}
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

# Per delivered order of the window: its codes counted (delivered + revoked - replaced, what a
# completed checkout's quantity must equal) and how many of its codes went to another order too
# (what must be 0; a code's other orders are looked for in the live table and the history alike);
# payments/audit.py hashes the same facts of its completed code checkouts.
SUMMARY = digests.summary_sql(f"""
FROM reservations_all r
CROSS JOIN LATERAL (SELECT {_COUNTED},
                           count(DISTINCT x.code_id) FILTER (WHERE x.status IN ('delivered', 'revoked') AND EXISTS (
                               SELECT 1 FROM deliveries_all y WHERE y.merchant_id = x.merchant_id AND y.code_id = x.code_id
                               AND y.order_id <> x.order_id AND y.status IN ('delivered', 'revoked'))) AS shared
                    FROM {_ORDER_DELIVERIES} x) d
{_REPLACED}
WHERE {_WINDOW}""",
    "r.order_id", "r.order_id", "r.merchant_id", "(d.delivered + d.revoked - c.replaced)::text", "d.shared::text")


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


async def digest_deliveries(pool, start: datetime, end: datetime, page_size: int, page_token: str,
                            bucket_count: int = 0, buckets: list[int] | None = None,
                            ) -> tuple[list[OrderDigest], list[Duplicate], str]:
    """One page of the window's delivered orders (those of `buckets` of `bucket_count` if given),
    the duplicates among their codes, and the token of the next page ('' on the last)."""
    size = paging.page_size(page_size, default=DEFAULT_PAGE, maximum=MAX_PAGE)
    buckets = digests.validate_buckets(bucket_count, buckets or [])
    query = paging.query_fingerprint("DigestDeliveries", start.isoformat(), end.isoformat(), str(bucket_count),
                                     ",".join(map(str, buckets)))
    after = paging.decode_keyset_text(page_token, query)
    at, last = after if after else (None, None)
    db = reports(pool)
    rows = await db.fetch(ORDERS, start, end, at, last, size + 1, bucket_count, buckets)
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


async def summarize_deliveries(pool, start: datetime, end: datetime, bucket_count: int) -> list[digests.Bucket]:
    """The window's delivered orders, per non-empty bucket of `bucket_count`."""
    rows = await reports(pool).fetch(SUMMARY, start, end, digests.require_count(bucket_count))
    return sorted(digests.buckets(rows).values(), key=lambda b: b.bucket)
