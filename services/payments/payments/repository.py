"""The payments SQL, as named constants. Every write that protects an invariant is one conditional
statement (version token, lease predicate, UNIQUE), never a read-then-write in Python."""
from __future__ import annotations

PAYMENT_COLUMNS = """id, checkout_id, customer_id, status, version, lease_owner, lease_until, psp_intent_id,
    psp_refund_id, amount_minor, currency, payment_method, idempotency_key, redirect_url, client_secret,
    failure_reason, reconcile_at, created_at, updated_at, merchant_id"""

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

# Issue 14: every read of the platform's operator (support, across merchants) leaves a row here,
# written before the answer is sent.
AUDIT_OPERATOR_READ = """
INSERT INTO operator_reads (subject, rpc, object_id, of_merchant, trace_id) VALUES ($1, $2, $3, $4, $5)
"""

INSERT_EVENT = """
INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING seq
"""

# Step 4 and 5 of DESIGN.md's finalize as one statement: the version-token UPDATE and the event it
# causes commit together or not at all. Zero rows means another path won the race.
# The customer action is kept only while the new status waits for the customer (the table's CHECK
# refuses anything else); reconciliation stops once the payment is terminal. A status change also
# wakes the payment's checkout saga, by trigger in the same statement (migration 0103).
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
        reconcile_at = CASE WHEN $3 IN ('succeeded', 'failed', 'canceled', 'refunded') THEN NULL ELSE reconcile_at END,
        updated_at = clock_timestamp()
    WHERE id = $1 AND version = $2
    RETURNING {PAYMENT_COLUMNS}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note)
    SELECT id, checkout_id, $9, $10, status, version, $11, $12 FROM upd
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
