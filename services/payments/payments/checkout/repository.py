"""The saga's SQL, as named constants, and the functions that map its rows.

Every write that protects an invariant is one conditional statement: a transition is
`UPDATE ... WHERE id = $1 AND version = $2 AND lease_owner = $3` (the version token fences a
stale worker, the lease owner a worker whose lease was taken over), and the timeline event is
appended by the same statement, so they commit together without a multi-statement transaction.
Every statement returns the database clock (`db_now`): TTL decisions use it, never the local clock.
`Sagas` runs them and returns `domain.Saga` rows (booking's repository convention). A payment's
wake-up of its saga is not here: the database does it (trigger `payments_wake_checkout`).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Union

import asyncpg

from cutylib import tenancy
from cutylib.telemetry import current_trace_id, current_traceparent

from .domain import (COMPLETED, DEFAULT_CANCELLATION_FEE_PERCENT, DEFAULT_FREE_CANCELLATION_HOURS, IDLE,
                     RESCHEDULE_CONFIRMING, RESCHEDULE_STATES, STATES, TERMINAL, Held, Saga)
from .reschedule import Learned

# NOTIFY channel of wake-ups; the payments trigger (checkouts_wake_on_payment) sends on the same name.
WAKE_CHANNEL = "cuty_checkout_wake"
# NOTIFY channel of live updates: every change of a checkout's state or version (trigger
# checkouts_notify_watchers), payload the checkout id (payments/checkout/live.py).
WATCH_CHANNEL = "cuty_checkout_events"



def in_list(states) -> str:
    """A constant SQL list of saga states, `('A', 'B')`, in the domain's order: the SQL here says
    the domain's sets, never a copy of them."""
    return "(" + ", ".join(f"'{s}'" for s in STATES if s in states) + ")"


_TERMINAL = in_list(TERMINAL)
# Nothing for a worker to do: terminal, or waiting for an operator.
_IDLE = in_list(IDLE)
_RETURNING = "RETURNING *, clock_timestamp() AS db_now"
_RESCHEDULE = in_list(RESCHEDULE_STATES)

# CreateCheckout's first write, the PENDING row with the request's saga lease, as part of its
# Idempotency-Key's statement (idempotency.begin_with): the checkout id is the key's resource id,
# the customer the key's ($1). Inserts nothing unless the key was taken (`began` has its row).
# $15: a one-call checkout's payment method (NULL: hold only), which makes the saga pay once held;
# $16: the seconds its charge may still start in (the request's deadline; NULL: none), pay_deadline;
# $17: a one-call booking's accepted no-show fee (NULL: none).
INSERT_PENDING = f"""
first AS (
    INSERT INTO checkouts (id, customer_id, kind, slot_id, product_id, quantity, order_id,
                           lease_owner, lease_until, next_run_at, traceparent, payment_method, pay_deadline,
                           no_show_fee_minor, no_show_fee_accepted_at)
    SELECT began.resource_id, $1, $8::text, $9::uuid, $10::uuid, $11::int,
           CASE WHEN $8::text = 'codes' THEN began.resource_id END, $12::text,
           clock_timestamp() + make_interval(secs => $13::float8),
           clock_timestamp() + make_interval(secs => $13::float8), $14::text, $15::text,
           CASE WHEN $15::text IS NOT NULL THEN clock_timestamp() + make_interval(secs => $16::float8) END,
           $17::bigint, CASE WHEN $17::bigint IS NOT NULL THEN clock_timestamp() END
    FROM began
    ON CONFLICT (id) DO NOTHING
    {_RETURNING}
)
"""

GET = "SELECT *, clock_timestamp() AS db_now FROM checkouts WHERE id = $1"
# A checkout's transitions (the saga's events in the payment event log) after an event id, oldest
# first: what a watcher has not been sent yet (payment_events_checkout serves it).
EVENTS_AFTER = """
SELECT seq, to_status, created_at FROM payment_events
WHERE checkout_id = $1 AND source = 'saga' AND seq > $2 ORDER BY seq
"""
# WatchCheckout's per-user cap (table watch_streams): the lowest place of $1 below the cap $4 that is
# free or whose lease ran out. Two streams racing for one place: the primary key lets one in, the
# other gets no row (and tries the next free place). Returns the place, or nothing when all are held.
CLAIM_WATCH_PLACE = """
INSERT INTO watch_streams AS w (subject, slot, process, stream, lease_until)
SELECT $1, s, $2, $3, clock_timestamp() + make_interval(secs => $5::float8)
FROM generate_series(0, $4::int - 1) AS s
WHERE NOT EXISTS (SELECT 1 FROM watch_streams x
                  WHERE x.subject = $1 AND x.slot = s AND x.lease_until > clock_timestamp())
ORDER BY s LIMIT 1
ON CONFLICT (subject, slot) DO UPDATE SET
    process = EXCLUDED.process, stream = EXCLUDED.stream, lease_until = EXCLUDED.lease_until,
    opened_at = clock_timestamp()
WHERE w.lease_until <= clock_timestamp()
RETURNING slot
"""
RELEASE_WATCH_PLACE = "DELETE FROM watch_streams WHERE subject = $1 AND slot = $2 AND stream = $3"
# One statement per process and lease period, whatever the number of its streams.
RENEW_WATCH_PLACES = """
UPDATE watch_streams SET lease_until = clock_timestamp() + make_interval(secs => $2::float8)
WHERE process = $1
"""

# Its latest transition: the id a watch starting without Last-Event-ID starts from.
LAST_EVENT = """
SELECT seq, to_status, created_at FROM payment_events
WHERE checkout_id = $1 AND source = 'saga' ORDER BY seq DESC LIMIT 1
"""
# A staff or admin read: $2 the caller's merchant, NULL for any.
GET_SEEN_BY = ("SELECT *, clock_timestamp() AS db_now FROM checkouts "
               "WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)")

# "Nothing changes" for a CreateCheckout refused as bad input: the row never held anything
# (a trigger refuses deleting any other state).
DELETE_PENDING = "DELETE FROM checkouts WHERE id = $1 AND state = 'PENDING' AND lease_owner = $2"

# A transition and its timeline event in one statement. $4 is the state the caller read (the
# version guard makes it the row's current state), so the event names both ends. Optional fields
# are COALESCEd: a transition never erases what an earlier step learned.
TRANSITION = f"""
WITH upd AS (
    UPDATE checkouts SET
        state = $4,
        outcome = COALESCE($5, outcome),
        version = version + 1,
        hold_id = COALESCE($6, hold_id),
        amount_minor = COALESCE($7, amount_minor),
        currency = COALESCE($8, currency),
        expire_time = COALESCE($9, expire_time),
        extended = extended OR $10,
        payment_id = COALESCE(payment_id, $11::uuid),
        -- a one-call checkout's PAY step starts the payment attempt (PayCheckout: START_CHARGING)
        payment_key = COALESCE(payment_key, $28::uuid),
        -- a payment link's offered no-show fee, accepted on the PSP's page at $29 (never twice,
        -- never another amount: CHECK checkouts_link_fee_is_the_offer)
        no_show_fee_minor = CASE WHEN $29::timestamptz IS NOT NULL AND no_show_fee_minor IS NULL
                                 THEN no_show_fee_offered_minor ELSE no_show_fee_minor END,
        no_show_fee_accepted_at = CASE WHEN $29::timestamptz IS NOT NULL AND no_show_fee_minor IS NULL
                                       AND no_show_fee_offered_minor IS NOT NULL
                                       THEN $29::timestamptz ELSE no_show_fee_accepted_at END,
        merchant_id = COALESCE(merchant_id, $18),
        salon_id = COALESCE(salon_id, $19::uuid),
        free_cancellation_hours = COALESCE(free_cancellation_hours, $20::int),
        cancellation_fee_percent = COALESCE(cancellation_fee_percent, $21::int),
        start_time = COALESCE(start_time, $22::timestamptz),
        -- What a reschedule's steps learn (START_RESCHEDULE reset them); its
        -- failure is the reschedule's, never the purchase's failure_reason
        reschedule_hold_id = COALESCE($23, reschedule_hold_id),
        reschedule_amount_minor = COALESCE($24::bigint, reschedule_amount_minor),
        reschedule_start_time = COALESCE($25::timestamptz, reschedule_start_time),
        reschedule_expire_time = COALESCE($26::timestamptz, reschedule_expire_time),
        reschedule_payment_id = COALESCE(reschedule_payment_id, $27::uuid),
        reschedule_failure = CASE WHEN $12 <> '' AND $13 IN {_RESCHEDULE} THEN $12 ELSE reschedule_failure END,
        failure_reason = CASE WHEN $12 = '' OR $13 IN {_RESCHEDULE} THEN failure_reason ELSE $12 END,
        attempts = 0, last_error = '', failing_since = NULL, updated_at = clock_timestamp(),
        -- Terminal: nothing left to do. $16: the saga waits now, so give the lease back and sleep
        -- until $17, unless a wake-up came during the step (SET sees the old `wakeup`): then keep
        -- the lease, clear the flag, and the caller looks again.
        next_run_at = CASE WHEN $4 IN {_TERMINAL} THEN NULL
                           WHEN $16 AND NOT wakeup THEN $17 ELSE next_run_at END,
        lease_owner = CASE WHEN $4 IN {_TERMINAL} OR ($16 AND NOT wakeup) THEN NULL ELSE lease_owner END,
        lease_until = CASE WHEN $4 IN {_TERMINAL} OR ($16 AND NOT wakeup) THEN NULL ELSE lease_until END,
        wakeup = CASE WHEN $4 IN {_TERMINAL} OR $16 THEN false ELSE wakeup END
    WHERE id = $1 AND version = $2 AND lease_owner = $3
    {_RETURNING}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT payment_id, id, 'saga', $13, state, version, $14, $15, merchant_id FROM upd WHERE state <> $13
)
SELECT * FROM upd
"""

# PayCheckout's first write: HELD -> CHARGING and the saga lease for the request, as part of its
# Idempotency-Key's statement (idempotency.begin_with): only when the key was taken (`began` has
# its row); customer = $1. The hold must not have run out (database clock): a buyer is never
# charged for an expired hold. $14: the seconds the charge may still start in (the request's
# deadline; NULL: none), pay_deadline.
START_CHARGING = f"""
first AS (
    UPDATE checkouts SET
        state = 'CHARGING', version = version + 1, payment_key = $9::uuid, payment_method = $10::text,
        pay_deadline = clock_timestamp() + make_interval(secs => $14::float8),
        lease_owner = $11::text,
        lease_until = clock_timestamp() + make_interval(secs => $12::float8),
        next_run_at = clock_timestamp() + make_interval(secs => $12::float8),
        wakeup = false, attempts = 0, last_error = '', updated_at = clock_timestamp(),
        -- $15: the no-show fee the customer accepts with this purchase (NULL: none)
        no_show_fee_minor = $15::bigint,
        no_show_fee_accepted_at = CASE WHEN $15::bigint IS NOT NULL THEN clock_timestamp() END
    WHERE id = $8::uuid AND customer_id = $1 AND state = 'HELD' AND expire_time > clock_timestamp()
      AND EXISTS (SELECT 1 FROM began)
    {_RETURNING}
), first_ev AS (
    INSERT INTO payment_events (checkout_id, source, from_status, to_status, version, trace_id, note, merchant_id)
    SELECT id, 'saga', 'HELD', state, version, $13::text, 'pay ' || $10::text, merchant_id FROM first
)
"""

# A retried PayCheckout (the same Idempotency-Key) whose first attempt died before its charge
# started: its caller is back, so the charge may start until this request's deadline too ($2
# seconds from now; NULL: no deadline, no limit). A worker that read the row before this and finds
# the old deadline passed still ends it (its decision is fenced by nothing here, and is right for
# the moment it read).
EXTEND_PAY_DEADLINE = """
UPDATE checkouts SET pay_deadline = CASE WHEN $2::float8 IS NULL THEN NULL
                                         ELSE GREATEST(pay_deadline, clock_timestamp() + make_interval(secs => $2::float8)) END
WHERE id = $1 AND state = 'CHARGING' AND payment_id IS NULL AND pay_deadline IS NOT NULL
"""

# CancelCheckout takes the lease whoever held it: every write of the displaced holder is fenced
# by version and owner, and all its remote steps are idempotent, so overriding is safe. A CHARGING
# checkout only once its payment is on the row (there is an intent to cancel) and while that payment
# is not captured: a captured payment goes to the confirm, as from CONFIRMING (a card captured at once
# is confirmed before anything is written: domain.confirms_with_capture, which this makes safe).
START_CANCEL = f"""
WITH upd AS (
    UPDATE checkouts SET
        state = 'RELEASING', outcome = 'CANCELLED', version = version + 1,
        failure_reason = 'cancelled-by-customer',
        lease_owner = $3,
        lease_until = clock_timestamp() + make_interval(secs => $4::float8),
        next_run_at = clock_timestamp() + make_interval(secs => $4::float8),
        wakeup = false, attempts = 0, last_error = '', updated_at = clock_timestamp()
    WHERE id = $1 AND customer_id = $2 AND version = $7
      AND (state IN ('HELD', 'AWAITING_ACTION')
           OR (state = 'CHARGING' AND payment_id IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.id = checkouts.payment_id
                               AND p.status IN ('succeeded', 'partially_refunded'))))
    {_RETURNING}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT payment_id, id, 'saga', $5, state, version, $6, 'cancel', merchant_id FROM upd
)
SELECT * FROM upd
"""

# docs/booking.md's policy defaults (domain.DEFAULT_*), for bookings held before policies existed.
DEFAULT_FREE_HOURS, DEFAULT_FEE_PERCENT = DEFAULT_FREE_CANCELLATION_HOURS, DEFAULT_CANCELLATION_FEE_PERCENT
# A COMPLETED booking cancelled after purchase: -> CANCELLING with the request's lease,
# the refund decided here with the database clock and never changed after. $2: the customer (their
# own checkout, refund per the policy recorded at purchase: everything before start - N hours, else
# (100 - fee) % of what was captured, rounded down), or NULL for staff ($3 their merchant: a full
# refund, the reason $9 required). Never more than what the merchant's own refunds left. Refused
# (no row) once the appointment has started (a customer's), and for a code purchase; the caller
# reads why. The policy defaults (24 h, 0 %) stand in for checkouts held before policies existed.
START_CANCEL_AFTER_PURCHASE = f"""
WITH upd AS (
    UPDATE checkouts c SET
        state = 'CANCELLING', version = c.version + 1,
        refund_amount_minor = LEAST(
            CASE WHEN $2::text IS NULL
                   OR clock_timestamp() < c.start_time
                        - make_interval(hours => COALESCE(c.free_cancellation_hours, {DEFAULT_FREE_HOURS}))
                 THEN COALESCE(c.amount_minor, 0)
                 ELSE COALESCE(c.amount_minor, 0)
                      * (100 - COALESCE(c.cancellation_fee_percent, {DEFAULT_FEE_PERCENT})) / 100 END,
            -- what is left of every captured payment of the checkout: the purchase's and the price
            -- increases of its reschedules; never a no-show fee's (off_session 'charge'), which a
            -- cancel does not give back (CAPTURED_PAYMENTS)
            COALESCE((SELECT sum(p.amount_minor - p.refunded_minor) FROM payments p
                      WHERE p.checkout_id = c.id AND p.status IN ('succeeded', 'partially_refunded', 'refunded')
                        AND p.off_session IS DISTINCT FROM 'charge'), 0)),
        cancelled_by = $8, cancel_reason = $9,
        failure_reason = CASE WHEN $2::text IS NULL THEN 'cancelled-by-staff' ELSE 'cancelled-by-customer' END,
        lease_owner = $4,
        lease_until = clock_timestamp() + make_interval(secs => $5::float8),
        next_run_at = clock_timestamp() + make_interval(secs => $5::float8),
        wakeup = false, attempts = 0, last_error = '', failing_since = NULL, updated_at = clock_timestamp()
    WHERE c.id = $1 AND c.version = $6 AND c.state = 'COMPLETED' AND c.kind = 'booking'
      AND ($2::text IS NULL OR (c.customer_id = $2 AND c.start_time > clock_timestamp()))
      AND ($3::text IS NULL OR c.merchant_id = $3)
    {_RETURNING}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT payment_id, id, 'saga', 'COMPLETED', state, version, $7,
           'cancel after purchase by ' || cancelled_by || ': refund ' || refund_amount_minor || ' '
           || COALESCE(currency, '') || ' minor units' || COALESCE('; reason: ' || cancel_reason, ''), merchant_id
    FROM upd
)
SELECT * FROM upd
"""

# COMPLETED -> RESCHEDULING, the request's first write, as part of its
# Idempotency-Key's statement (idempotency.begin_with: only when the key was taken). A new reschedule
# number (its steps' keys carry it), the target slot, the old slot and hold remembered, the facts of
# the last reschedule cleared. $13: the customer (their own booking, until its free-cancellation
# cutoff, database clock), NULL for staff; $14: the staff's merchant (NULL: any). Writes nothing
# otherwise (the caller reads why). One reschedule at a time: it starts from COMPLETED only.
START_RESCHEDULE = f"""
first AS (
    UPDATE checkouts c SET
        state = 'RESCHEDULING', version = c.version + 1,
        reschedule_seq = c.reschedule_seq + 1, reschedule_status = 'in_progress',
        reschedule_slot_id = $9::uuid, reschedule_from_slot_id = c.slot_id, reschedule_from_hold_id = c.hold_id,
        reschedule_from_amount_minor = c.amount_minor,
        reschedule_hold_id = NULL, reschedule_amount_minor = NULL, reschedule_start_time = NULL,
        reschedule_expire_time = NULL, reschedule_payment_id = NULL, reschedule_payment_method = $10::text,
        rescheduled_by = $11::text, reschedule_failure = '',
        lease_owner = $12::text,
        lease_until = clock_timestamp() + make_interval(secs => $15::float8),
        next_run_at = clock_timestamp() + make_interval(secs => $15::float8),
        wakeup = false, attempts = 0, last_error = '', failing_since = NULL, updated_at = clock_timestamp()
    WHERE c.id = $8::uuid AND c.state = 'COMPLETED' AND c.kind = 'booking' AND c.slot_id <> $9::uuid
      AND ($13::text IS NULL OR (c.customer_id = $13::text AND clock_timestamp() < c.start_time
               - make_interval(hours => COALESCE(c.free_cancellation_hours, {DEFAULT_FREE_CANCELLATION_HOURS}))))
      AND ($14::text IS NULL OR c.merchant_id = $14::text)
      AND EXISTS (SELECT 1 FROM began)
    {_RETURNING}
), first_ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT payment_id, id, 'saga', 'COMPLETED', state, version, $16::text,
           'reschedule #' || reschedule_seq || ' by ' || rescheduled_by || ': slot ' || slot_id || ' -> '
           || reschedule_slot_id, merchant_id
    FROM first
)
"""

# The end of a reschedule, back to COMPLETED. $4 true (from RESCHEDULE_CONFIRMING): the new slot,
# hold, price and start become the booking's (SET reads the old row: the old ones were remembered
# by START_RESCHEDULE) and the outbox trigger writes booking.rescheduled; false: undone, nothing of
# the booking changes, the reschedule's failure recorded ($5, when given). Fenced like TRANSITION.
END_RESCHEDULE = f"""
WITH upd AS (
    UPDATE checkouts SET
        state = 'COMPLETED', version = version + 1,
        slot_id = CASE WHEN $4 THEN reschedule_slot_id ELSE slot_id END,
        hold_id = CASE WHEN $4 THEN reschedule_hold_id ELSE hold_id END,
        amount_minor = CASE WHEN $4 THEN reschedule_amount_minor ELSE amount_minor END,
        start_time = CASE WHEN $4 THEN reschedule_start_time ELSE start_time END,
        expire_time = CASE WHEN $4 THEN reschedule_expire_time ELSE expire_time END,
        reschedules = reschedules + CASE WHEN $4 THEN 1 ELSE 0 END,
        reschedule_status = CASE WHEN $4 THEN 'rescheduled' ELSE 'reverted' END,
        reschedule_failure = CASE WHEN $5 = '' THEN reschedule_failure ELSE $5 END,
        attempts = 0, last_error = '', failing_since = NULL, updated_at = clock_timestamp(),
        next_run_at = NULL, lease_owner = NULL, lease_until = NULL, wakeup = false
    WHERE id = $1 AND version = $2 AND lease_owner = $3
    {_RETURNING}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT payment_id, id, 'saga', $6, state, version, $7, $8, merchant_id FROM upd
)
SELECT * FROM upd
"""

# Workers claim due sagas: SKIP LOCKED so replicas never wait on or double-claim a row; the lease
# is taken and next_run_at pushed to its end in the same statement (a crash leaves the row due
# again when the lease runs out). Each row gets its own owner token. The due sagas are found through
# sagas_live (migration 0330: a row per saga not finished or scheduled, kept by trigger), whose index
# holds no history; the checkout's own next_run_at is checked again on the row locked.
CLAIM_DUE = """
WITH due AS (
    SELECT c.id FROM sagas_live q JOIN checkouts c ON c.id = q.checkout_id
    -- stable, so it bounds the index scan at the last due saga (volatile clock_timestamp()
    -- could not: every poll read every scheduled saga)
    WHERE q.next_run_at <= statement_timestamp() AND c.next_run_at <= statement_timestamp()
    ORDER BY q.next_run_at
    LIMIT $2
    FOR UPDATE OF c SKIP LOCKED
)
UPDATE checkouts c SET
    lease_owner = $1 || ':' || gen_random_uuid()::text,
    lease_until = clock_timestamp() + make_interval(secs => $3::float8),
    next_run_at = clock_timestamp() + make_interval(secs => $3::float8),
    wakeup = false
FROM due WHERE c.id = due.id
RETURNING c.*, clock_timestamp() AS db_now
"""

# One named saga, if nobody holds it (a client retry resuming a PENDING checkout).
TAKE_LEASE = f"""
UPDATE checkouts SET
    lease_owner = $2,
    lease_until = clock_timestamp() + make_interval(secs => $3::float8),
    next_run_at = clock_timestamp() + make_interval(secs => $3::float8),
    wakeup = false
WHERE id = $1 AND state NOT IN {_IDLE}
  AND (lease_until IS NULL OR lease_until <= clock_timestamp())
{_RETURNING}
"""

HEARTBEAT = """
UPDATE checkouts SET
    lease_until = clock_timestamp() + make_interval(secs => $3::float8),
    next_run_at = clock_timestamp() + make_interval(secs => $3::float8)
WHERE id = $1 AND lease_owner = $2
"""

# Give the lease back, due again at $3 (NULL: only a wake-up brings it back). Refused while a
# wake-up arrived during our step: the caller then clears it (CLEAR_WAKEUP) and looks again.
RELEASE = """
UPDATE checkouts SET lease_owner = NULL, lease_until = NULL, next_run_at = $3
WHERE id = $1 AND lease_owner = $2 AND NOT wakeup
"""

CLEAR_WAKEUP = f"UPDATE checkouts SET wakeup = false WHERE id = $1 AND lease_owner = $2 {_RETURNING}"

# A drive cancelled mid-step (shutdown, a client hanging up on a synchronous request): the step is
# idempotent, so hand the saga to any replica now instead of leaving it until the lease expires.
# $3: the request that drove the saga ran out of time before its charge started: from now on the
# charge may not start (pay_deadline), whatever was recorded (that one is late by the request's
# wait for a connection).
HAND_BACK = f"""
UPDATE checkouts SET lease_owner = NULL, lease_until = NULL, wakeup = false, next_run_at = clock_timestamp(),
    pay_deadline = CASE WHEN $3 AND payment_id IS NULL AND payment_method IS NOT NULL
                        THEN LEAST(COALESCE(pay_deadline, clock_timestamp()), clock_timestamp())
                        ELSE pay_deadline END
WHERE id = $1 AND lease_owner = $2 AND state NOT IN {_IDLE}
"""

# A failed step: back off ($3 seconds) and let any replica take the next attempt. A finishing step
# (CONFIRMING, RELEASING, REFUNDING) that has now failed $5 times, or for $6 seconds, gives up
# instead: NEEDS_ATTENTION, off the queue, remembering the state to return to, with its event.
# Returns the row's state afterwards.
RETRY_LATER = """
WITH g AS (
    SELECT id, state AS from_state,
           state IN ('CONFIRMING', 'RELEASING', 'REFUNDING', 'CANCELLING', 'RESCHEDULING', 'RESCHEDULE_CONFIRMING',
                     'RESCHEDULE_REVERTING')
           AND (attempts + 1 >= $5
                OR COALESCE(failing_since, clock_timestamp()) <= clock_timestamp() - make_interval(secs => $6::float8))
           AS give_up
    FROM checkouts WHERE id = $1 AND lease_owner = $2
), upd AS (
    UPDATE checkouts c SET lease_owner = NULL, lease_until = NULL, wakeup = false,
        attempts = c.attempts + 1, last_error = left($4, 500),
        failing_since = COALESCE(c.failing_since, clock_timestamp()),
        state = CASE WHEN g.give_up THEN 'NEEDS_ATTENTION' ELSE c.state END,
        attention_from = CASE WHEN g.give_up THEN c.state END,
        version = c.version + CASE WHEN g.give_up THEN 1 ELSE 0 END,
        updated_at = CASE WHEN g.give_up THEN clock_timestamp() ELSE c.updated_at END,
        next_run_at = CASE WHEN g.give_up THEN NULL
                           ELSE clock_timestamp() + make_interval(secs => $3::float8) END
    FROM g WHERE c.id = g.id AND c.lease_owner = $2
    RETURNING c.id, c.payment_id, c.merchant_id, c.state, c.version, c.attempts, g.from_state
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT payment_id, id, 'saga', from_state, state, version, $7,
           'retries exhausted after ' || attempts || ' attempts; an operator may retry', merchant_id
    FROM upd WHERE state = 'NEEDS_ATTENTION'
)
SELECT state FROM upd
"""

# An operator's retry of a NEEDS_ATTENTION saga: back to the state it left, due now, with a fresh
# attempt count; every replica's worker hears the NOTIFY at commit.
RETRY_BY_OPERATOR = f"""
WITH upd AS (
    UPDATE checkouts SET state = attention_from, attention_from = NULL, version = version + 1,
        attempts = 0, failing_since = NULL, last_error = '', updated_at = clock_timestamp(),
        next_run_at = clock_timestamp()
    WHERE id = $1 AND state = 'NEEDS_ATTENTION' AND ($4::text IS NULL OR merchant_id = $4)
    {_RETURNING}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note,
                                merchant_id)
    SELECT payment_id, id, 'saga', 'NEEDS_ATTENTION', state, version, $2, 'retried by ' || $3, merchant_id FROM upd
), n AS (
    SELECT pg_notify('{WAKE_CHANNEL}', id::text) FROM upd
)
SELECT upd.* FROM upd LEFT JOIN (SELECT count(*) FROM n) notified ON true
"""

# ListCheckouts: newest first, (created_at, id) descending as the keyset. The WHERE is
# built from the filters the request has (LIST_FILTERS, in this order), so each combination is its
# own prepared statement whose plan walks the index that leads with its columns (the lists' indexes):
# the customer's `(customer_id, created_at DESC, id DESC)`, a merchant's `(merchant_id, [salon_id |
# product_id,] created_at DESC, id DESC)`, the operator's `(created_at DESC, id DESC)`. The payment's
# status comes with the row (one statement per page, no read per checkout).
# The page's checkouts first, then their payments: a plan that sorts the matching checkouts (the
# planner may pick one when it expects fewer rows than a page) joins the page's payments only, not
# those of every checkout of the salon, product or state (1,249 lookups for a page of 51, measured).
LIST_CHECKOUTS = """
SELECT c.*, clock_timestamp() AS db_now, p.status AS payment_status
  FROM (SELECT c.* FROM checkouts c
         WHERE {where}
         ORDER BY c.created_at DESC, c.id DESC
         LIMIT {limit}) c
  LEFT JOIN payments p ON p.id = c.payment_id
 ORDER BY c.created_at DESC, c.id DESC
"""
LIST_FILTERS = {
    "customer_id": "c.customer_id = ${}::text",
    "merchant_id": "c.merchant_id = ${}::text",
    "salon_id": "c.salon_id = ${}::uuid",
    "product_id": "c.product_id = ${}::uuid",
    "state": "c.state = ${}::text",
    "created_after": "c.created_at >= ${}::timestamptz",
    "created_before": "c.created_at < ${}::timestamptz",
}
# After the previous page's last row.
LIST_AFTER = "(c.created_at, c.id) < (${}::timestamptz, ${}::uuid)"


@dataclass(frozen=True)
class ListQuery:
    """What a ListCheckouts page reads: who (customer_id for a customer, merchant_id for staff and
    admins, neither for the operator) and the filters; None = not filtered by it."""
    customer_id: str | None = None
    merchant_id: str | None = None
    salon_id: str | None = None
    product_id: str | None = None
    state: str | None = None
    created_after: object | None = None
    created_before: object | None = None


def list_statement(q: ListQuery, after: tuple | None, limit: int) -> tuple[str, list]:
    """The statement and arguments of one page (`after`: (created_at, id) of the previous page's last)."""
    where, args = [], []
    for name, fragment in LIST_FILTERS.items():
        value = getattr(q, name)
        if value is not None:
            args.append(value)
            where.append(fragment.format(len(args)))
    if after is not None:
        args.extend(after)
        where.append(LIST_AFTER.format(len(args) - 1, len(args)))
    args.append(limit)
    return LIST_CHECKOUTS.format(where=" AND ".join(where) or "true", limit=f"${len(args)}"), args


# No hold learned, nothing a reschedule learned: TRANSITION's COALESCEs keep every column.
_NOT_HELD = Held(hold_id=None, expire_time=None, amount_minor=None, currency=None, merchant_id=None)  # type: ignore[arg-type]
_NOTHING_LEARNED = Learned()


@dataclass(frozen=True)
class Fields:
    """What a transition may record besides the state."""
    outcome: str | None = None
    # The hold or reservation (its id, price, expiry, merchant; a booking's salon, policy and
    # start), recorded once with the move to HELD.
    held: Held | None = None
    expire_time: object | None = None  # a hold's new expiry (an extension)
    extended: bool = False
    payment_id: str | None = None
    payment_key: str | None = None  # a one-call checkout's payment attempt, set by its PAY step
    failure_reason: str = ""
    reschedule: Learned | None = None  # what a reschedule's steps learn
    # A payment link's customer accepted its offered no-show fee on the PSP's page, at this time.
    no_show_fee_accepted_at: datetime | None = None

    @property
    def expires(self):
        """The hold's expiry this move records: an extension's, or the new hold's (None: unchanged)."""
        return self.expire_time or (self.held.expire_time if self.held is not None else None)


@dataclass(frozen=True)
class CheckoutEvent:
    """One transition of a checkout as the event log has it (a live update's id and state)."""
    seq: int
    state: str
    at: datetime


def saga_of(row) -> Saga | None:
    return None if row is None else Saga.from_row(row)


def insert_pending(*, kind: str, slot_id: str | None, product_id: str | None, quantity: int, owner: str,
                   lease_seconds: float, payment_method: str | None = None,
                   pay_within: float | None = None, no_show_fee_minor: int | None = None) -> tuple[str, tuple]:
    """CreateCheckout's first write, for IdempotencyStore.claim(first=...). `pay_within`: a one-call
    checkout's seconds in which its charge may start (the request's deadline), None: no limit.
    `no_show_fee_minor`: a one-call booking's accepted no-show fee (None: none)."""
    return INSERT_PENDING, (kind, slot_id, product_id, quantity, owner, lease_seconds, current_traceparent(),
                            payment_method, pay_within, no_show_fee_minor)


def start_charging(*, checkout_id: str, payment_key: str, payment_method: str, owner: str,
                   lease_seconds: float, pay_within: float | None = None,
                   no_show_fee_minor: int | None = None) -> tuple[str, tuple]:
    """PayCheckout's first write, for IdempotencyStore.claim(first=...). `pay_within`: the seconds in
    which the charge may start (the request's deadline), None: no limit. `no_show_fee_minor`: the
    no-show fee the customer accepts (recorded with the checkout; None: none)."""
    return START_CHARGING, (checkout_id, payment_key, payment_method, owner, lease_seconds, current_trace_id(),
                            pay_within, no_show_fee_minor)


def start_reschedule(*, checkout_id: str, slot_id: str, payment_method: str | None, who: str, owner: str,
                     customer: str | None, merchant: str | None, lease_seconds: float) -> tuple[str, tuple]:
    """RescheduleCheckout's first write, for IdempotencyStore.claim(first=...)."""
    return START_RESCHEDULE, (checkout_id, slot_id, payment_method, who, owner, customer, merchant, lease_seconds,
                              current_trace_id())


def saga_of_first(row) -> Saga | None:
    """The saga row a first write returned with its key, or None when it wrote nothing."""
    return None if row is None or row["id"] is None else Saga.from_row(row)


Db = Union[asyncpg.Connection, asyncpg.Pool]


class Sagas:
    """The checkout rows: every method is one statement, and returns the row it read or wrote
    (None when a fenced write wrote nothing)."""

    def __init__(self, db: Db):
        self.db = db

    async def get(self, checkout_id: str) -> Saga | None:
        return saga_of(await self.db.fetchrow(GET, checkout_id))

    async def delete_pending(self, checkout_id: str, owner: str) -> None:
        await self.db.execute(DELETE_PENDING, checkout_id, owner)

    async def transition(self, saga: Saga, owner: str, state: str, fields: Fields = Fields(), note: str = "", *,
                         release: bool = False, wake_at=None) -> Saga | None:
        """The new row, or None when fenced (another actor moved the saga or took the lease).
        `release`: give the lease back, due again at `wake_at` (the row's lease_owner then says
        whether it was given back or kept because a wake-up arrived). A reschedule's way back to
        COMPLETED is END_RESCHEDULE."""
        if saga.state in RESCHEDULE_STATES and state == COMPLETED:
            return saga_of(await self.db.fetchrow(
                END_RESCHEDULE, saga.id, saga.version, owner, saga.state == RESCHEDULE_CONFIRMING,
                fields.failure_reason, saga.state, current_trace_id(), note))
        h, r = fields.held or _NOT_HELD, fields.reschedule or _NOTHING_LEARNED
        return saga_of(await self.db.fetchrow(
            TRANSITION, saga.id, saga.version, owner, state, fields.outcome, h.hold_id, h.amount_minor,
            h.currency, fields.expires, fields.extended, fields.payment_id, fields.failure_reason,
            saga.state, current_trace_id(), note, release, wake_at, h.merchant_id, h.salon_id,
            h.free_cancellation_hours, h.cancellation_fee_percent, h.start_time,
            r.hold_id, r.amount_minor, r.start_time, r.expire_time, r.payment_id, fields.payment_key,
            fields.no_show_fee_accepted_at))

    async def start_cancel(self, saga: Saga, owner: str, lease_seconds: float) -> Saga | None:
        return saga_of(await self.db.fetchrow(START_CANCEL, saga.id, saga.customer_id, owner, lease_seconds,
                                              saga.state, current_trace_id(), saga.version))

    async def start_cancel_after_purchase(self, saga: Saga, owner: str, lease_seconds: float, *,
                                          customer: str | None, merchant: str | None, who: str,
                                          reason: str | None) -> Saga | None:
        """COMPLETED -> CANCELLING, None when refused or the row moved since `saga` was read."""
        return saga_of(await self.db.fetchrow(START_CANCEL_AFTER_PURCHASE, saga.id, customer, merchant, owner,
                                              lease_seconds, saga.version, current_trace_id(), who, reason))

    async def claim_due(self, worker_id: str, limit: int, lease_seconds: float) -> list[Saga]:
        return [Saga.from_row(r) for r in await self.db.fetch(CLAIM_DUE, worker_id, limit, lease_seconds)]

    async def take_lease(self, checkout_id: str, owner: str, lease_seconds: float) -> Saga | None:
        return saga_of(await self.db.fetchrow(TAKE_LEASE, checkout_id, owner, lease_seconds))

    async def heartbeat(self, checkout_id: str, owner: str, lease_seconds: float) -> bool:
        return (await self.db.execute(HEARTBEAT, checkout_id, owner, lease_seconds)) == "UPDATE 1"

    async def release(self, saga: Saga, owner: str, next_run_at) -> Saga | None | bool:
        """True when released; else the re-read row after clearing a wake-up (look again), or None
        when the lease is no longer ours."""
        if (await self.db.execute(RELEASE, saga.id, owner, next_run_at)) == "UPDATE 1":
            return True
        return saga_of(await self.db.fetchrow(CLEAR_WAKEUP, saga.id, owner))

    async def retry_later(self, saga: Saga, owner: str, delay_seconds: float, error: str, *, max_attempts: int,
                          attention_after_seconds: float) -> str | None:
        """Back off, or hand a finishing step that failed too long to an operator. The saga's state
        afterwards (NEEDS_ATTENTION when it gave up), None when the lease was no longer ours."""
        return await self.db.fetchval(RETRY_LATER, saga.id, owner, delay_seconds, error, max_attempts,
                                      attention_after_seconds, current_trace_id())

    async def retry_by_operator(self, checkout_id: str, operator: str, merchant: str | None = None) -> Saga | None:
        """NEEDS_ATTENTION -> the state it left, due now; None when the saga was not waiting for one
        (or is not of `merchant`, when given)."""
        return saga_of(await self.db.fetchrow(RETRY_BY_OPERATOR, checkout_id, current_trace_id(), operator, merchant))

    async def get_seen_by(self, checkout_id: str, caller) -> Saga | None:
        """The checkout as a staff or admin user may see it: their merchant's only, read
        inside tenancy.scoped (Row-Level Security narrows it too). `self.db` must be the pool."""
        return saga_of(await tenancy.fetchrow(self.db, GET_SEEN_BY, checkout_id, tenancy.merchant_filter(caller),
                                              principal=caller))

    async def list(self, q: ListQuery, after: tuple | None, limit: int) -> list[tuple[Saga, str | None]]:
        """One page of checkouts, newest first, each with its payment's status (None: no payment).
        `self.db` is the caller's connection (inside tenancy.scoped for staff and admins)."""
        query, args = list_statement(q, after, limit)
        return [(Saga.from_row(r), r["payment_status"]) for r in await self.db.fetch(query, *args)]
    async def events_after(self, checkout_id: str, after: int, caller) -> list[CheckoutEvent]:
        """The checkout's transitions after event `after`, as `caller` may read them (inside
        tenancy.scoped for staff and admins). `self.db` must be the pool."""
        rows = await tenancy.fetch(self.db, EVENTS_AFTER, checkout_id, after, principal=caller)
        return [CheckoutEvent(r["seq"], r["to_status"], r["created_at"]) for r in rows]

    async def last_event(self, checkout_id: str, caller) -> CheckoutEvent | None:
        row = await tenancy.fetchrow(self.db, LAST_EVENT, checkout_id, principal=caller)
        return None if row is None else CheckoutEvent(row["seq"], row["to_status"], row["created_at"])

    async def extend_pay_deadline(self, checkout_id: str, pay_within: float | None) -> None:
        await self.db.execute(EXTEND_PAY_DEADLINE, checkout_id, pay_within)

    async def hand_back(self, checkout_id: str, owner: str, *, caller_gone: bool = False) -> None:
        await self.db.execute(HAND_BACK, checkout_id, owner, caller_gone)
