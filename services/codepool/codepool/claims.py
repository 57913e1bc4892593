"""Claims on delivered codes (docs/codepool.md, "Claims, replacement and batch quarantine").

A buyer (their own order) or the merchant's staff open a claim on a code delivered to an order;
an admin resolves it through the orchestrator (payments' ResolveClaim), which settles it here step
by step: replaced, rejected, or refunding -> refunded (the refund is the orchestrator's). Every step
is one call of a database function that locks the claim row, checks its status, writes the change,
its audit entry and its merchant event (the outbox the orchestrator relays; also its payment
timeline) in one transaction (migrations/functions/codepool_claim_*.sql): Python only translates
outcomes into answers.
"""
from __future__ import annotations

import datetime as dt
import logging
import uuid
from dataclasses import dataclass

import asyncpg

from cutylib import paging, tenancy
from cutylib.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from cutylib.principal import Principal
from cutylib.telemetry import set_span_attributes

from . import metrics

log = logging.getLogger("codepool.claims")

KINDS = ("does_not_work", "already_used")
STATUSES = ("open", "refunding", "replaced", "refunded", "rejected")
# What the steps of a resolution are called in codepool_claim_settle (and the replacement's own function).
STEPS = ("replace", "reject", "refund", "refunded", "reopen")
MAX_REASON = 500
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500

# Claim ids are derived from the caller and its Idempotency-Key, so a replay finds the first claim.
_CLAIM_NAMESPACE = uuid.UUID("6f1c2d0e-6b8f-4f39-9a57-0c7d3e2b9a11")

CLAIM_ALREADY_OPEN = "CP010"   # codepool_claim_open: the code has an unresolved claim
CLAIM_NOT_OPEN = "CP011"       # a step the claim's status does not allow
NO_REPLACEMENT = "CP012"       # no available code of the product to replace it with
NOT_DELIVERED = "CP013"        # the claimed code is no longer delivered to the order

OPEN = "SELECT * FROM codepool_claim_open($1, $2, $3, $4, $5, $6, $7, $8)"
REPLACE = "SELECT * FROM codepool_claim_replace($1, $2, $3, $4)"
SETTLE = "SELECT * FROM codepool_claim_settle($1, $2, $3, $4, $5, $6)"

# A customer reads their own claims; staff and admins their merchant's ($2; NULL: any).
GET = """
SELECT * FROM code_claims WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)
  AND ($3::text IS NULL OR customer_id = $3)
"""

# Oldest first, keyset on (opened_at, id); every filter optional. Staff and admins: their merchant;
# a customer: their own (code_claims_by_customer); the system's refund finisher: every merchant's
# unresolved ones (code_claims_unresolved).
LIST = """
SELECT * FROM code_claims
WHERE ($1::text IS NULL OR merchant_id = $1) AND ($2::text IS NULL OR customer_id = $2)
  AND ($3::text IS NULL OR status = $3) AND ($4::uuid IS NULL OR product_id = $4)
  AND ($5::uuid IS NULL OR batch_id = $5)
  AND ($6::timestamptz IS NULL OR (opened_at, id) > ($6, $7::uuid))
ORDER BY opened_at, id
LIMIT $8
"""


@dataclass(frozen=True)
class Claim:
    id: str
    merchant_id: str
    order_id: str
    product_id: str
    batch_id: str
    code_id: str
    customer_id: str
    kind: str
    reason: str
    status: str
    opened_by: str
    opened_at: dt.datetime
    resolved_by: str
    resolved_at: dt.datetime | None
    resolution_note: str
    replacement_code_id: str
    refund_minor: int | None
    currency: str
    refund_id: str
    refund_attempt: int = 0

    @classmethod
    def from_row(cls, r) -> "Claim":
        return cls(str(r["id"]), r["merchant_id"], r["order_id"], str(r["product_id"]), str(r["batch_id"]),
                   str(r["code_id"]), r["customer_id"], r["kind"], r["reason"], r["status"], r["opened_by"],
                   r["opened_at"], r["resolved_by"] or "", r["resolved_at"], r["resolution_note"] or "",
                   str(r["replacement_code_id"] or ""), r["refund_minor"], r["currency"] or "", r["refund_id"] or "",
                   r["refund_attempt"])


def require_reason(field: str, value: str, *, required: bool = True) -> str:
    value = value.strip()
    if (required and not value) or len(value) > MAX_REASON or not value.isprintable():
        raise InvalidArgument(field, f"{field} must be {1 if required else 0}..{MAX_REASON} printable characters, "
                                     f"got {len(value)} characters")
    return value


def claim_id_for(scope: str, order_id: str, code_id: uuid.UUID, key: str) -> uuid.UUID:
    """The claim an Idempotency-Key names: per caller (a customer, or a merchant's staff), order and code."""
    return uuid.uuid5(_CLAIM_NAMESPACE, "\x1f".join((scope, order_id, str(code_id), key)))


def _caller_scope(p: Principal) -> tuple[str | None, str | None, str]:
    """(customer filter, merchant filter, idempotency scope) of a caller: a customer is confined to
    their own orders, staff and admins to their merchant's, `system` to nothing."""
    if p.role == "customer":
        return p.require_subject(), None, "customer:" + p.require_subject()
    merchant = tenancy.merchant_filter(p)
    if merchant is not None:
        return None, merchant, "merchant:" + merchant
    return None, None, "system"


def _row_or_none(row):
    return row if row is not None and row["id"] is not None else None


class Claims:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def open(self, p: Principal, order_id: str, code_id: uuid.UUID, kind: str, reason: str, key: str,
                   actor: str) -> Claim:
        set_span_attributes(order_id=order_id)
        customer, merchant, scope = _caller_scope(p)
        claim_id = claim_id_for(scope, order_id, code_id, key)
        try:
            async with tenancy.scoped(self.pool, p) as uow:
                row = _row_or_none(await uow.conn.fetchrow(OPEN, claim_id, order_id, code_id, customer, merchant,
                                                           kind, reason, actor))
                await uow.commit()
        except asyncpg.PostgresError as e:
            if getattr(e, "sqlstate", None) == CLAIM_ALREADY_OPEN:
                raise AlreadyExists(f"code {code_id} has an unresolved claim already; it is resolved first",
                                    reason="claim-open") from None
            raise
        if row is None:
            # Another customer's order, another merchant's, or a code not delivered to it (any more):
            # worded as a missing one (existence is not leaked).
            raise NotFound(f"no code {code_id} delivered to checkout {order_id}")
        claim = Claim.from_row(row)
        if (claim.order_id, claim.code_id, claim.kind, claim.reason) != (order_id, str(code_id), kind, reason):
            raise FailedPrecondition(f"Idempotency-Key {key!r} was used for another claim ({claim.id})",
                                     reason="idempotency-key-reused")
        metrics.REGISTRY.claims.labels("opened").inc()
        log.info("code claim opened", extra={"claim_id": claim.id, "order_id": order_id, "kind": kind})
        return claim

    async def get(self, p: Principal, claim_id: uuid.UUID) -> Claim:
        customer, merchant, _ = _caller_scope(p)
        row = await tenancy.fetchrow(self.pool, GET, claim_id, merchant, customer, principal=p)
        if row is None:
            raise NotFound(f"no claim {claim_id}")
        return Claim.from_row(row)

    async def list(self, p: Principal, *, status: str | None, product_id: uuid.UUID | None,
                   batch_id: uuid.UUID | None, page_size: int, page_token: str,
                   all_merchants: bool = False) -> tuple[list[Claim], str]:
        customer, merchant, scope = _caller_scope(p)
        if customer is None and merchant is None and not all_merchants:
            raise InvalidArgument("all_merchants", "an internal caller lists every merchant's claims explicitly")
        size = paging.page_size(page_size, default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)
        query = paging.query_fingerprint(scope, status, product_id, batch_id)
        after = paging.decode_keyset(page_token, query, 1)
        at, last = (after[0], after[1][0]) if after else (None, None)
        rows = await tenancy.fetch(self.pool, LIST, merchant, customer, status, product_id, batch_id, at, last, size,
                                   principal=p)
        claims = [Claim.from_row(r) for r in rows]
        token = (paging.encode_keyset(query, rows[-1]["opened_at"], rows[-1]["id"]) if len(rows) == size else "")
        return claims, token

    async def settle(self, claim_id: uuid.UUID, step: str, *, actor: str, note: str = "",
                     refund_id: str = "") -> Claim:
        """One step of a claim's resolution, for the orchestrator (`system`): see the module's doc."""
        set_span_attributes(claim_id=str(claim_id))
        try:
            async with tenancy.scoped(self.pool) as uow:
                if step == "replace":
                    row = await uow.conn.fetchrow(REPLACE, claim_id, None, actor, note or None)
                else:
                    row = await uow.conn.fetchrow(SETTLE, claim_id, None, step, actor, note or None, refund_id or None)
                row = _row_or_none(row)
                await uow.commit()
        except asyncpg.PostgresError as e:
            raise _settle_error(e, claim_id, step) from None
        if row is None:
            raise NotFound(f"no claim {claim_id}")
        claim = Claim.from_row(row)
        metrics.REGISTRY.claims.labels(step).inc()
        log.info("code claim settled", extra={"claim_id": claim.id, "step": step, "status": claim.status})
        return claim


def _settle_error(e: asyncpg.PostgresError, claim_id: uuid.UUID, step: str) -> Exception:
    state = getattr(e, "sqlstate", None)
    if state == CLAIM_NOT_OPEN:
        return FailedPrecondition(f"claim {claim_id} is resolved (or being refunded) already: it cannot {step} now",
                                  reason="claim-resolved")
    if state == NO_REPLACEMENT:
        return ResourceExhausted(f"no code is available to replace the claimed one (claim {claim_id}); "
                                 "import codes, or refund instead", reason="out-of-stock")
    if state == NOT_DELIVERED:
        return FailedPrecondition(f"the claimed code is no longer delivered to its order (claim {claim_id})",
                                  reason="code-not-delivered")
    return e

