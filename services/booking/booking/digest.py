"""The invariant auditor's digest of booking (payments' auditor, docs/payments.md, "The invariant
auditor"): the holds created in a time window that were confirmed, a booking or one cancelled after
purchase, with what confirmed them. One keyset page per call, over the partial index holds_digest
(migration 0100); the auditor pages through a window, never another service's database.

`summarize_holds` answers the same window per bucket of the hold ids' hash (cutylib.digests): the
auditor compares it with its own and pages only the buckets that disagree (`buckets`), so a window
where the books balance moves a few hundred numbers instead of its holds (the covering index
holds_summary, migration 0260)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cutylib import digests, paging
from cutylib.db import reports

DEFAULT_PAGE = 1000
MAX_PAGE = 5000
MAX_WINDOW_SECONDS = 86400.0

DIGEST = f"""
SELECT id, coalesce(payment_ref, cancelled_payment_ref) AS payment_ref, status, cancelled_at IS NOT NULL AS cancelled,
       merchant_id, price_minor, currency, created_at
FROM holds
WHERE (status = 'confirmed' OR cancelled_at IS NOT NULL)
  AND created_at >= $1 AND created_at < $2
  AND ($3::timestamptz IS NULL OR (created_at, id) > ($3, $4::uuid))
  AND {digests.in_buckets_sql("id::text", "$6", "$7")}
ORDER BY created_at, id
LIMIT $5"""
# What the auditor expects of a completed booking checkout's hold: confirmed, not cancelled, with
# the checkout's payment (payments/audit.py hashes the same facts of its checkouts).
SUMMARY = digests.summary_sql("""FROM holds WHERE status = 'confirmed' AND cancelled_at IS NULL
  AND created_at >= $1 AND created_at < $2""", "id::text", "id::text", "payment_ref", "merchant_id")


@dataclass(frozen=True)
class HoldDigest:
    id: str
    payment_ref: str
    status: str
    cancelled: bool
    merchant_id: str
    price_minor: int
    currency: str
    created_at: datetime


async def digest_holds(pool, start: datetime, end: datetime, page_size: int, page_token: str,
                       bucket_count: int = 0, buckets: list[int] | None = None) -> tuple[list[HoldDigest], str]:
    """One page of the window's confirmed holds (those of `buckets` of `bucket_count` if given) and
    the token of the next ('' on the last)."""
    size = paging.page_size(page_size, default=DEFAULT_PAGE, maximum=MAX_PAGE)
    buckets = digests.validate_buckets(bucket_count, buckets or [])
    query = paging.query_fingerprint("DigestHolds", start.isoformat(), end.isoformat(), str(bucket_count),
                                     ",".join(map(str, buckets)))
    after = paging.decode_keyset(page_token, query, 1)
    at, last = (after[0], after[1][0]) if after else (None, None)
    rows = await reports(pool).fetch(DIGEST, start, end, at, last, size + 1, bucket_count, buckets)
    more = len(rows) > size
    rows = rows[:size]
    holds = [HoldDigest(str(r["id"]), r["payment_ref"] or "", r["status"], r["cancelled"], r["merchant_id"],
                        r["price_minor"], r["currency"], r["created_at"]) for r in rows]
    token = paging.encode_keyset(query, rows[-1]["created_at"], rows[-1]["id"]) if more else ""
    return holds, token


async def summarize_holds(pool, start: datetime, end: datetime, bucket_count: int) -> list[digests.Bucket]:
    """The window's confirmed holds not cancelled, per non-empty bucket of `bucket_count`."""
    rows = await reports(pool).fetch(SUMMARY, start, end, digests.require_count(bucket_count))
    return sorted(digests.buckets(rows).values(), key=lambda b: b.bucket)
