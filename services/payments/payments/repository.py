"""The payments SQL, as named constants. Every write that protects an invariant is one conditional
statement (version token, lease predicate, UNIQUE), never a read-then-write in Python."""
from __future__ import annotations

PAYMENT_COLUMNS = """id, checkout_id, customer_id, status, version, lease_owner, lease_until, psp_intent_id,
    psp_refund_id, amount_minor, currency, payment_method, idempotency_key, redirect_url, client_secret,
    failure_reason, reconcile_at, created_at, updated_at, merchant_id, refunded_minor, refund_settled_minor"""

GET_PAYMENT = f"SELECT {PAYMENT_COLUMNS} FROM payments WHERE id = $1"
# A user's read (issue 14): $2 is the caller's merchant (staff, admin) or NULL (any merchant), so
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
                          reconcile_at, merchant_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp() + make_interval(secs => $8::float8), $10)
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
        -- The PSP says the whole charge went back (issue 12: the running totals follow).
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

# Reconciliation claims due payments (SKIP LOCKED: replicas never pick the same row) and takes their
# lease in the same statement; the next attempt backs off exponentially with jitter.
CLAIM_RECONCILE = f"""
WITH due AS (
    SELECT id, lease_owner FROM payments
    WHERE status IN ('created', 'requires_action', 'processing')
      AND reconcile_at <= now()  -- stable, so it bounds the index scan (volatile clock_timestamp() cannot)
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    ORDER BY reconcile_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
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
CAPTURED_PAYMENTS = """
SELECT p.id::text AS id, p.amount_minor - p.refunded_minor AS left_minor, r.requested_minor AS asked_minor
FROM payments p
LEFT JOIN refunds r ON r.merchant_id = p.merchant_id AND r.payment_id = p.id
     AND r.key = CASE WHEN p.id = $4::uuid THEN $2::text ELSE $3::text || p.id::text END
WHERE p.checkout_id = $1 AND p.status IN ('succeeded', 'partially_refunded', 'refunded')
ORDER BY p.id = $4::uuid DESC, p.created_at, p.id
"""

# -- PSP events ------------------------------------------------------------------------------------

MARK_PSP_EVENT = """
UPDATE psp_events SET
    status = $2,
    processed_at = CASE WHEN $2 IN ('processed', 'ignored') THEN clock_timestamp() END,
    next_attempt_at = CASE WHEN $2 IN ('deferred', 'received')
                           THEN clock_timestamp() + make_interval(secs => $3::float8) END,
    last_error = $4
WHERE event_id = $1 AND status IN ('received', 'deferred')
"""

# Claiming pushes next_attempt_at forward: the row is invisible to other replicas until then.
# Handled events past the retention period (issue 10, item 10), oldest first, a batch at a time.
PURGE_PSP_EVENTS = """
DELETE FROM psp_events WHERE event_id IN (
    SELECT event_id FROM psp_events
    WHERE status IN ('processed', 'ignored')
      AND processed_at < clock_timestamp() - make_interval(secs => $1::float8 * 86400)
    ORDER BY processed_at
    LIMIT $2)
"""

CLAIM_PSP_EVENTS = """
WITH due AS (
    SELECT event_id FROM psp_events
    WHERE status IN ('received', 'deferred') AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE psp_events e SET attempts = e.attempts + 1,
    next_attempt_at = clock_timestamp() + make_interval(secs => $2::float8)
FROM due
WHERE e.event_id = due.event_id
RETURNING e.event_id, e.type, e.payment_id, e.payload, e.attempts
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
