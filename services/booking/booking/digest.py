"""The invariant auditor's digest of booking (payments' auditor, docs/payments.md, "The invariant
auditor"): the holds created in a time window that were confirmed, a booking or one cancelled after
purchase, with what confirmed them. One keyset page per call, over the partial index holds_digest
(migration 0100); the auditor pages through a window, never another service's database."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cutylib import paging
from cutylib.db import reports

DEFAULT_PAGE = 1000
MAX_PAGE = 5000
MAX_WINDOW_SECONDS = 86400.0

DIGEST = """
SELECT id, coalesce(payment_ref, cancelled_payment_ref) AS payment_ref, status, cancelled_at IS NOT NULL AS cancelled,
       merchant_id, price_minor, currency, created_at
FROM holds
WHERE (status = 'confirmed' OR cancelled_at IS NOT NULL)
  AND created_at >= $1 AND created_at < $2
  AND ($3::timestamptz IS NULL OR (created_at, id) > ($3, $4::uuid))
ORDER BY created_at, id
LIMIT $5"""


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


async def digest_holds(pool, start: datetime, end: datetime, page_size: int,
                       page_token: str) -> tuple[list[HoldDigest], str]:
    """One page of the window's confirmed holds and the token of the next ('' on the last)."""
    size = paging.page_size(page_size, default=DEFAULT_PAGE, maximum=MAX_PAGE)
    query = paging.query_fingerprint("DigestHolds", start.isoformat(), end.isoformat())
    after = paging.decode_keyset(page_token, query, 1)
    at, last = (after[0], after[1][0]) if after else (None, None)
    rows = await reports(pool).fetch(DIGEST, start, end, at, last, size + 1)
    more = len(rows) > size
    rows = rows[:size]
    holds = [HoldDigest(str(r["id"]), r["payment_ref"] or "", r["status"], r["cancelled"], r["merchant_id"],
                        r["price_minor"], r["currency"], r["created_at"]) for r in rows]
    token = paging.encode_keyset(query, rows[-1]["created_at"], rows[-1]["id"]) if more else ""
    return holds, token
