"""The payments SQL, as named constants, run by `Payments` and `Refunds`, which answer the core's
value objects (views.py). Every write that protects an invariant is one conditional statement
(version token, lease predicate, UNIQUE), never a read-then-write in Python."""
from __future__ import annotations

import uuid
from typing import Any

from cutylib import tenancy
from cutylib.principal import Principal

from . import domain
from .views import CapturedPayment, PaymentView, RefundView, TimelineEvent

PAYMENT_COLUMNS = """id, checkout_id, customer_id, status, version, lease_owner, lease_until, psp_intent_id,
    psp_refund_id, amount_minor, currency, payment_method, idempotency_key, redirect_url, client_secret,
    failure_reason, reconcile_at, created_at, updated_at, merchant_id, refunded_minor, refund_settled_minor,
    off_session, psp_customer, consent_minor"""

GET_PAYMENT = f"SELECT {PAYMENT_COLUMNS} FROM payments WHERE id = $1"
# A user's read: $2 is the caller's merchant (staff, admin) or NULL (any merchant), so
# another merchant's payment is not found.
GET_PAYMENT_SEEN_BY = f"SELECT {PAYMENT_COLUMNS} FROM payments WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)"
GET_BY_KEY = f"SELECT {PAYMENT_COLUMNS} FROM payments WHERE merchant_id = $1 AND idempotency_key = $2"
GET_BY_INTENT_SEEN_BY = (f"SELECT {PAYMENT_COLUMNS} FROM payments "
                         "WHERE psp_intent_id = $1 AND ($2::text IS NULL OR merchant_id = $2)")

# ON CONFLICT DO NOTHING: two concurrent creates with one key race on the UNIQUE index, not in Python.
# The payment and its first event are one statement (one implicit transaction): both or neither,
# and no event for a create that lost the race (the CTE returned no row).
INSERT_PAYMENT = f"""
WITH ins AS (
    INSERT INTO payments (id, checkout_id, customer_id, amount_minor, currency, payment_method, idempotency_key,
                          reconcile_at, merchant_id, off_session, psp_customer, consent_minor)
    VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp() + make_interval(secs => $8::float8), $10, $11, $12, $13)
    ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
    RETURNING {PAYMENT_COLUMNS}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT id, checkout_id, 'sync', NULL, status, version, $9, 'payment created', merchant_id FROM ins
)
SELECT * FROM ins
"""

# Steps 4 and 5 of finalize (docs/payments.md) as one statement: the version-token UPDATE and the event it
# causes commit together or not at all. Zero rows means another path won the race.
# The customer action is kept only while the new status waits for the customer (the table's CHECK
# refuses anything else); reconciliation stops once the payment is terminal. A status change also
# wakes the payment's checkout saga, by trigger in the same statement (payments_wake_checkout).
FINALIZE = f"""
WITH upd AS (
    UPDATE payments SET
        status = $3,
        version = version + 1,
        psp_intent_id = COALESCE(psp_intent_id, $4),
        redirect_url = CASE WHEN $3 = 'requires_action' THEN COALESCE($5, redirect_url) END,
        client_secret = CASE WHEN $3 = 'requires_action' THEN COALESCE($6, client_secret) END,
        failure_reason = COALESCE($7, failure_reason),
        psp_refund_id = COALESCE($8, psp_refund_id),
        -- The PSP says the whole charge went back (the running totals follow).
        refunded_minor = CASE WHEN $3 = 'refunded' THEN amount_minor ELSE refunded_minor END,
        refund_settled_minor = CASE WHEN $3 = 'refunded' THEN amount_minor ELSE refund_settled_minor END,
        reconcile_at = CASE WHEN $3 IN ('succeeded', 'failed', 'canceled', 'refunded') THEN NULL ELSE reconcile_at END,
        updated_at = clock_timestamp()
    WHERE id = $1 AND version = $2
    RETURNING {PAYMENT_COLUMNS}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT id, checkout_id, $9, $10, status, version, $11, $12, merchant_id FROM upd
)
SELECT * FROM upd
"""

# Learning the intent id without a status change (webhook-first scenarios fill it in via FINALIZE).
SET_INTENT_ID = f"""
UPDATE payments SET psp_intent_id = $2 WHERE id = $1 AND psp_intent_id IS NULL RETURNING {PAYMENT_COLUMNS}
"""

# The lease: taken when free, expired, or already ours. The CTE locks the row so `previous_owner`
# is the owner we displaced (a takeover when it is someone else's expired lease).
TAKE_LEASE = """
WITH cur AS (SELECT id, lease_owner, lease_until FROM payments WHERE id = $1 FOR UPDATE)
UPDATE payments p SET lease_owner = $2, lease_until = clock_timestamp() + make_interval(secs => $3::float8)
FROM cur
WHERE p.id = cur.id
  AND (cur.lease_until IS NULL OR cur.lease_until < clock_timestamp() OR cur.lease_owner = $2)
RETURNING cur.lease_owner AS previous_owner
"""

# Only our own lease is released; if ours expired and was taken over, the new owner's stays.
RELEASE_LEASE = "UPDATE payments SET lease_owner = NULL, lease_until = NULL WHERE id = $1 AND lease_owner = $2"

# The statuses a payment is not final in, as SQL says them: the domain's, never a copy.
_NON_TERMINAL = "(" + ", ".join(f"'{s}'" for s in domain.NON_TERMINAL) + ")"

# Reconciliation claims due payments (SKIP LOCKED: replicas never pick the same row) and takes their
# lease in the same statement; the next attempt backs off exponentially with jitter. The due payments
# are found through payments_live (migration 0331: a row per payment not final, kept by trigger),
# whose index holds no history.
CLAIM_RECONCILE = f"""
WITH due AS (
    SELECT p.id, p.lease_owner FROM payments_live l JOIN payments p ON p.id = l.payment_id
    WHERE l.reconcile_at <= now()  -- stable, so it bounds the index scan (volatile clock_timestamp() cannot)
      AND p.status IN {_NON_TERMINAL}  -- the payment's own, on the row locked
      AND p.reconcile_at <= now()
      AND (p.lease_until IS NULL OR p.lease_until < clock_timestamp())
    ORDER BY l.reconcile_at
    LIMIT $1
    FOR UPDATE OF p SKIP LOCKED
)
UPDATE payments p SET
    lease_owner = $2,
    lease_until = clock_timestamp() + make_interval(secs => $3::float8),
    reconcile_attempts = p.reconcile_attempts + 1,
    reconcile_at = clock_timestamp()
        + make_interval(secs => $4::float8 * power(2, least(p.reconcile_attempts, 6)) * (1 + random() * 0.2))
FROM due
WHERE p.id = due.id
RETURNING {', '.join('p.' + c.strip() for c in PAYMENT_COLUMNS.split(','))}, due.lease_owner AS previous_owner
"""

# Events of the payment, plus the checkout's own (saga) events that name no other payment attempt.
# One page, after the event `seq` $3 (0: from the start), at most $4 events; $5 the payment's merchant.
TIMELINE = """
SELECT seq, payment_id, checkout_id, source, from_status, to_status, version, trace_id, note, created_at
FROM payment_events WHERE merchant_id = $5 AND payment_id = $1 AND seq > $3
UNION ALL
SELECT seq, payment_id, checkout_id, source, from_status, to_status, version, trace_id, note, created_at
FROM payment_events WHERE checkout_id = $2 AND payment_id IS NULL AND seq > $3
ORDER BY seq
LIMIT $4
"""

# A cancel after purchase refunds across the checkout's captured payments (a
# reschedule to a dearer slot charged a second one): the purchase's first, then by time; what is
# left of each, and what an earlier attempt of this cancel asked of it ($2: the purchase's refund
# key; $3: the prefix of the others', completed by the payment id).
# A no-show fee's own payment (off_session 'charge') is no part of what a cancel gives back: the fee
# is for the no-show, and staff refund it only by asking for that payment's refund themselves
# (IssueRefund; docs/checkout.md, "No-show fee").
CAPTURED_PAYMENTS = """
SELECT p.id::text AS id, p.amount_minor - p.refunded_minor AS left_minor, r.requested_minor AS asked_minor
FROM payments p
LEFT JOIN refunds r ON r.merchant_id = p.merchant_id AND r.payment_id = p.id
     AND r.key = CASE WHEN p.id = $4::uuid THEN $2::text ELSE $3::text || p.id::text END
WHERE p.checkout_id = $1 AND p.status IN ('succeeded', 'partially_refunded', 'refunded')
  AND p.off_session IS DISTINCT FROM 'charge'
ORDER BY p.id = $4::uuid DESC, p.created_at, p.id
"""

# -- refunds (the refunds table and the payment's running totals) -------------------------------------

REFUND_COLUMNS = """id, merchant_id, payment_id, key, requested_minor, amount_minor, currency, reason, requested_by,
    status, psp_refund_id, failure_reason, created_at, updated_at"""

# The reservation: one statement locks the payment (the CTE's FOR UPDATE waits for a concurrent
# refund and then reads its committed totals), adds the amount to the running total only if it
# fits (the CHECK refunded_minor <= amount_minor backs it), inserts the refund `pending`, and
# appends the timeline event with the amount, the reason and who. $5 NULL: the rest of what was
# captured. $8: may refund a codes purchase whose codes were delivered (docs/payments.md, "Refunds").
# A second refund with the same key fails on UNIQUE refunds_key and takes the whole statement back
# with it (the running total included); the caller then answers the first one.
# $1 refund id, $2 merchant, $3 payment, $4 key, $5 requested amount, $6 reason, $7 who, $8 codes
# allowed, $9 trace id, $10 the note's start, $11 the currency asked (NULL: the payment's).
RESERVE_REFUND = f"""
WITH cur AS (
    SELECT id, amount_minor, refunded_minor, version, status,
           COALESCE($5::bigint, amount_minor - refunded_minor) AS amount
    FROM payments WHERE id = $3 AND merchant_id = $2
    FOR UPDATE
), upd AS (
    UPDATE payments p SET refunded_minor = cur.refunded_minor + cur.amount, version = cur.version + 1,
                          updated_at = clock_timestamp()
    FROM cur
    WHERE p.id = cur.id
      AND cur.status IN ('succeeded', 'partially_refunded')
      AND cur.amount > 0 AND cur.refunded_minor + cur.amount <= cur.amount_minor
      AND ($11::text IS NULL OR p.currency = $11)
      AND ($8::boolean OR NOT EXISTS (
            SELECT 1 FROM checkouts c
            WHERE c.id = p.checkout_id AND c.kind = 'codes' AND c.state = 'COMPLETED'))
    RETURNING p.id, p.merchant_id, p.checkout_id, p.currency, p.status, p.version, cur.amount
), ins AS (
    INSERT INTO refunds (id, merchant_id, payment_id, key, requested_minor, amount_minor, currency, reason,
                         requested_by)
    SELECT $1, merchant_id, id, $4, $5, amount, currency, $6, $7 FROM upd
    RETURNING {REFUND_COLUMNS}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT id, checkout_id, 'sync', status, status, version, $9,
           format('%s (refund %s of %s %s minor units, pending)', $10::text, $1::uuid, amount, currency), merchant_id
    FROM upd
)
SELECT {REFUND_COLUMNS} FROM ins
"""

GET_REFUND_BY_KEY = f"SELECT {REFUND_COLUMNS} FROM refunds WHERE merchant_id = $1 AND payment_id = $2 AND key = $3"

# Why a reservation wrote nothing (the message only: the decision was RESERVE_REFUND's).
REFUND_REFUSAL = """
SELECT p.status, p.amount_minor, p.refunded_minor, p.currency,
       EXISTS (SELECT 1 FROM checkouts c WHERE c.id = p.checkout_id AND c.kind = 'codes'
                                            AND c.state = 'COMPLETED') AS codes_delivered
FROM payments p WHERE p.id = $1 AND p.merchant_id = $2
"""

# The PSP refunded: the refund succeeds and the settled total (which decides partially_refunded or
# refunded) rises, with the timeline event, in one statement. Only a pending refund settles, once.
# LEAST: the PSP may have reported the whole charge refunded (finalize) before this refund's answer.
SETTLE_REFUND = f"""
WITH r AS (
    UPDATE refunds SET status = 'succeeded', psp_refund_id = $2, updated_at = clock_timestamp()
    WHERE id = $1 AND status = 'pending'
    RETURNING {REFUND_COLUMNS}
), cur AS (
    SELECT p.id, p.status, p.version, p.amount_minor, p.refund_settled_minor
    FROM payments p WHERE p.id = (SELECT payment_id FROM r)
    FOR UPDATE
), upd AS (
    UPDATE payments p SET
        refund_settled_minor = LEAST(cur.amount_minor, cur.refund_settled_minor + r.amount_minor),
        status = CASE WHEN LEAST(cur.amount_minor, cur.refund_settled_minor + r.amount_minor) = cur.amount_minor
                      THEN 'refunded' ELSE 'partially_refunded' END,
        psp_refund_id = COALESCE(p.psp_refund_id, $2),
        version = cur.version + 1,
        updated_at = clock_timestamp()
    FROM cur, r
    WHERE p.id = cur.id
    RETURNING p.id, p.checkout_id, p.merchant_id, p.status, p.version, cur.status AS from_status
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT upd.id, upd.checkout_id, $4, upd.from_status, upd.status, upd.version, $3,
           format('refund %s of %s %s minor units succeeded at the PSP (%s); requested by %s: %s',
                  r.id, r.amount_minor, r.currency, $2::text, r.requested_by, r.reason), upd.merchant_id
    FROM upd, r
)
SELECT {REFUND_COLUMNS} FROM r
"""

# The PSP refused the refund for good: it fails and its amount leaves the running total.
FAIL_REFUND = f"""
WITH r AS (
    UPDATE refunds SET status = 'failed', failure_reason = $2, updated_at = clock_timestamp()
    WHERE id = $1 AND status = 'pending'
    RETURNING {REFUND_COLUMNS}
), cur AS (
    SELECT p.id, p.status, p.version, p.refunded_minor, p.refund_settled_minor
    FROM payments p WHERE p.id = (SELECT payment_id FROM r)
    FOR UPDATE
), upd AS (
    UPDATE payments p SET
        refunded_minor = GREATEST(cur.refund_settled_minor, cur.refunded_minor - r.amount_minor),
        version = cur.version + 1, updated_at = clock_timestamp()
    FROM cur, r
    WHERE p.id = cur.id
    RETURNING p.id, p.checkout_id, p.merchant_id, p.status, p.version
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT upd.id, upd.checkout_id, 'sync', upd.status, upd.status, upd.version, $3,
           format('refund %s of %s %s minor units refused by the PSP: %s', r.id, r.amount_minor, r.currency, $2::text),
           upd.merchant_id
    FROM upd, r
)
SELECT {REFUND_COLUMNS} FROM r
"""

GET_REFUND = f"SELECT {REFUND_COLUMNS} FROM refunds WHERE id = $1"
PENDING_REFUNDS_OF = f"SELECT {REFUND_COLUMNS} FROM refunds WHERE payment_id = $1 AND status = 'pending' ORDER BY created_at"

# Reconciliation of refunds left pending (a PSP timeout, a crash before or after the PSP call):
# claiming moves updated_at forward, so another replica skips the refund until it is due again.
CLAIM_PENDING_REFUNDS = f"""
WITH due AS (
    SELECT id FROM refunds
    WHERE status = 'pending' AND updated_at < clock_timestamp() - make_interval(secs => $2::float8)
    ORDER BY created_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE refunds r SET updated_at = clock_timestamp() FROM due WHERE r.id = due.id
RETURNING {', '.join('r.' + c.strip() for c in REFUND_COLUMNS.split(','))}
"""


def _payment(row: Any) -> PaymentView | None:
    return PaymentView.from_row(row) if row is not None else None


def _refund(row: Any) -> RefundView | None:
    return RefundView.from_row(row) if row is not None else None


class Payments:
    """The payments rows. Every method is one statement on `db` (a pool or the caller's connection)
    and answers the payment as read or written: None when there is none, or when a fenced write
    wrote nothing (another path won the version or the lease)."""

    def __init__(self, db: Any):
        self.db = db

    async def get(self, payment_id: uuid.UUID) -> PaymentView | None:
        return _payment(await self.db.fetchrow(GET_PAYMENT, payment_id))

    async def get_seen_by(self, payment_id: uuid.UUID, seen_by: Principal) -> PaymentView | None:
        """Within the user's merchant only (and Row-Level Security narrows the read as well)."""
        return _payment(await tenancy.fetchrow(self.db, GET_PAYMENT_SEEN_BY, payment_id,
                                               tenancy.merchant_filter(seen_by), principal=seen_by))

    async def by_key(self, merchant_id: str, idempotency_key: str) -> PaymentView | None:
        return _payment(await self.db.fetchrow(GET_BY_KEY, merchant_id, idempotency_key))

    async def by_intent_seen_by(self, psp_intent_id: str, seen_by: Principal) -> PaymentView | None:
        return _payment(await tenancy.fetchrow(self.db, GET_BY_INTENT_SEEN_BY, psp_intent_id,
                                               tenancy.merchant_filter(seen_by), principal=seen_by))

    async def insert(self, payment_id: uuid.UUID, checkout_id: uuid.UUID | None, customer_id: str, amount_minor: int,
                     currency: str, payment_method: str, idempotency_key: str, reconcile_after_seconds: float,
                     trace_id: str, merchant_id: str, off_session: str | None = None,
                     psp_customer: str | None = None, consent_minor: int | None = None) -> PaymentView | None:
        """The new payment and its "created" event; None when the key was used before."""
        return _payment(await self.db.fetchrow(INSERT_PAYMENT, payment_id, checkout_id, customer_id, amount_minor,
                                               currency, payment_method, idempotency_key,
                                               float(reconcile_after_seconds), trace_id, merchant_id, off_session,
                                               psp_customer, consent_minor))

    async def write(self, read: PaymentView, observed: str, intent_id: str | None, redirect_url: str | None,
                    client_secret: str | None, failure_reason: str | None, psp_refund_id: str | None, source: str,
                    trace_id: str, note: str) -> PaymentView | None:
        """FINALIZE from the payment as `read`: None when its version moved (another path won)."""
        return _payment(await self.db.fetchrow(
            FINALIZE, uuid.UUID(read.id), read.version, observed, intent_id, redirect_url, client_secret,
            failure_reason, psp_refund_id, source, read.status, trace_id, note))

    async def learn_intent(self, payment_id: uuid.UUID, psp_intent_id: str) -> PaymentView | None:
        """The intent id, where none is known yet (no status change)."""
        return _payment(await self.db.fetchrow(SET_INTENT_ID, payment_id, psp_intent_id))

    async def take_lease(self, payment_id: uuid.UUID, owner: str, lease_seconds: float) -> tuple[bool, str | None]:
        """(taken, the owner displaced: None when the lease was free)."""
        row = await self.db.fetchrow(TAKE_LEASE, payment_id, owner, float(lease_seconds))
        return (False, None) if row is None else (True, row["previous_owner"])

    async def release_lease(self, payment_id: uuid.UUID, owner: str) -> None:
        await self.db.execute(RELEASE_LEASE, payment_id, owner)

    async def claim_reconcile(self, limit: int, owner: str, lease_seconds: float,
                              backoff_seconds: float) -> list[tuple[PaymentView, str | None]]:
        """Due non-terminal payments, leased to `owner`: (payment, the owner displaced)."""
        rows = await self.db.fetch(CLAIM_RECONCILE, limit, owner, float(lease_seconds), float(backoff_seconds))
        return [(PaymentView.from_row(r), r["previous_owner"]) for r in rows]

    async def timeline(self, payment: PaymentView, after_seq: int, limit: int,
                       seen_by: Principal | None) -> list[TimelineEvent]:
        rows = await tenancy.fetch(self.db, TIMELINE, uuid.UUID(payment.id),
                                   uuid.UUID(payment.checkout_id) if payment.checkout_id else None,
                                   after_seq, limit, payment.merchant_id, principal=seen_by)
        return [TimelineEvent.from_row(r) for r in rows]

    async def captured_payments(self, checkout_id: str, purchase_payment_id: str | None, purchase_key: str,
                                other_key_prefix: str) -> list[CapturedPayment]:
        rows = await self.db.fetch(CAPTURED_PAYMENTS, checkout_id, purchase_key, other_key_prefix,
                                   purchase_payment_id or "00000000-0000-0000-0000-000000000000")
        return [CapturedPayment(r["id"], r["left_minor"], r["asked_minor"]) for r in rows]


class Refunds:
    """The refunds rows and the payment's running totals they move. Every method is one statement
    on `db` and answers the refund as read or written (None: none, or nothing written)."""

    def __init__(self, db: Any):
        self.db = db

    async def reserve(self, refund_id: uuid.UUID, merchant_id: str, payment_id: uuid.UUID, key: str,
                      amount_minor: int | None, reason: str, actor: str, codes_delivered_ok: bool, trace_id: str,
                      note: str, currency: str | None) -> RefundView | None:
        """RESERVE_REFUND: None when it does not fit (or the key was used: UniqueViolationError)."""
        return _refund(await self.db.fetchrow(RESERVE_REFUND, refund_id, merchant_id, payment_id, key, amount_minor,
                                              reason, actor, codes_delivered_ok, trace_id, note, currency))

    async def by_key(self, merchant_id: str, payment_id: uuid.UUID, key: str,
                     seen_by: Principal | None = None) -> RefundView | None:
        return _refund(await tenancy.fetchrow(self.db, GET_REFUND_BY_KEY, merchant_id, payment_id, key,
                                              principal=seen_by))

    async def refusal(self, payment_id: uuid.UUID, merchant_id: str) -> Any:
        """The facts that say why a reservation wrote nothing (the payment's status, totals,
        currency, delivered codes), or None when the payment is not the merchant's."""
        return await self.db.fetchrow(REFUND_REFUSAL, payment_id, merchant_id)

    async def settle(self, refund_id: uuid.UUID, psp_refund_id: str, trace_id: str, source: str) -> RefundView | None:
        """The PSP refunded; None when it was settled already."""
        return _refund(await self.db.fetchrow(SETTLE_REFUND, refund_id, psp_refund_id, trace_id, source))

    async def fail(self, refund_id: uuid.UUID, failure_reason: str, trace_id: str) -> RefundView | None:
        """The PSP refused for good; None when it was not pending any more."""
        return _refund(await self.db.fetchrow(FAIL_REFUND, refund_id, failure_reason, trace_id))

    async def get(self, refund_id: uuid.UUID) -> RefundView | None:
        return _refund(await self.db.fetchrow(GET_REFUND, refund_id))

    async def pending_of(self, payment_id: uuid.UUID) -> list[RefundView]:
        return [RefundView.from_row(r) for r in await self.db.fetch(PENDING_REFUNDS_OF, payment_id)]

    async def claim_pending(self, limit: int, older_than_seconds: float) -> list[RefundView]:
        return [RefundView.from_row(r) for r in await self.db.fetch(CLAIM_PENDING_REFUNDS, limit,
                                                                    float(older_than_seconds))]

