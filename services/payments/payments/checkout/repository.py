"""The saga's SQL, as named constants, and the functions that map its rows.

Every write that protects an invariant is one conditional statement: a transition is
`UPDATE ... WHERE id = $1 AND version = $2 AND lease_owner = $3` (the version token fences a
stale worker, the lease owner a worker whose lease was taken over), and the timeline event is
appended by the same statement, so they commit together without a multi-statement transaction.
Every statement returns the database clock (`db_now`): TTL decisions use it, never the local clock.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import asyncpg

from cutylib import tenancy
from cutylib.telemetry import current_trace_id, current_traceparent

from .domain import Saga

WAKE_CHANNEL = "cuty_checkout_wake"

_TERMINAL = "('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED')"
# Nothing for a worker to do: terminal, or waiting for an operator (issue 10, item 8).
_IDLE = "('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED', 'NEEDS_ATTENTION')"
_RETURNING = "RETURNING *, clock_timestamp() AS db_now"

INSERT_PENDING = f"""
INSERT INTO checkouts (id, customer_id, kind, slot_id, product_id, quantity, order_id,
                       lease_owner, lease_until, next_run_at, traceparent)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
        clock_timestamp() + make_interval(secs => $9::float8),
        clock_timestamp() + make_interval(secs => $9::float8), $10)
ON CONFLICT (id) DO NOTHING
{_RETURNING}
"""

# INSERT_PENDING as the first write of CreateCheckout's Idempotency-Key statement
# (idempotency.BEGIN_WITH): the checkout id is the key's resource id, the customer the key's ($1).
INSERT_PENDING_WITH_KEY = f"""
first AS (
    INSERT INTO checkouts (id, customer_id, kind, slot_id, product_id, quantity, order_id,
                           lease_owner, lease_until, next_run_at, traceparent)
    SELECT began.resource_id, $1, $8::text, $9::uuid, $10::uuid, $11::int,
           CASE WHEN $8::text = 'codes' THEN began.resource_id END, $12::text,
           clock_timestamp() + make_interval(secs => $13::float8),
           clock_timestamp() + make_interval(secs => $13::float8), $14::text
    FROM began
    ON CONFLICT (id) DO NOTHING
    {_RETURNING}
)
"""

GET = "SELECT *, clock_timestamp() AS db_now FROM checkouts WHERE id = $1"
# A staff or admin read (issue 14): $2 the caller's merchant, NULL for any.
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
        merchant_id = COALESCE(merchant_id, $18),
        failure_reason = CASE WHEN $12 = '' THEN failure_reason ELSE $12 END,
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

# TRANSITION that also stores the synchronous request's answer under its Idempotency-Key
# (idempotency.FINISH), when the transition ends the drive: the saga is terminal or gave its lease
# back (not kept for a wake-up), so the request answers right after with exactly this view.
# $19: the serialized answer, $20..$22 the key. `key_done` says whether it was stored.
TRANSITION_AND_FINISH = TRANSITION.replace("""
SELECT * FROM upd
""", """, key_done AS (
    UPDATE checkout_idempotency_keys SET state = 'done', response = $19, response_is_error = false,
        locked_until = NULL
    WHERE customer_id = $20 AND operation = $21 AND key = $22 AND state = 'in_flight'
      AND EXISTS (SELECT 1 FROM upd WHERE upd.lease_owner IS NULL)
    RETURNING 1
)
SELECT upd.*, EXISTS (SELECT 1 FROM key_done) AS key_done FROM upd
""")
assert TRANSITION_AND_FINISH != TRANSITION

# PayCheckout: HELD -> CHARGING and the saga lease for the request, in one statement. The hold
# must not have run out (database clock): a buyer is never charged for an expired hold.
START_CHARGING = f"""
WITH upd AS (
    UPDATE checkouts SET
        state = 'CHARGING', version = version + 1, payment_key = $3, payment_method = $4,
        lease_owner = $5,
        lease_until = clock_timestamp() + make_interval(secs => $6::float8),
        next_run_at = clock_timestamp() + make_interval(secs => $6::float8),
        wakeup = false, attempts = 0, last_error = '', updated_at = clock_timestamp()
    WHERE id = $1 AND customer_id = $2 AND state = 'HELD' AND expire_time > clock_timestamp()
    {_RETURNING}
), ev AS (
    INSERT INTO payment_events (checkout_id, source, from_status, to_status, version, trace_id, note)
    SELECT id, 'saga', 'HELD', state, version, $7, 'pay ' || $4 FROM upd
)
SELECT * FROM upd
"""

# START_CHARGING as the first write of PayCheckout's Idempotency-Key statement
# (idempotency.BEGIN_WITH): only when the key was taken (`began` has its row); customer = $1.
START_CHARGING_WITH_KEY = f"""
first AS (
    UPDATE checkouts SET
        state = 'CHARGING', version = version + 1, payment_key = $9::uuid, payment_method = $10::text,
        lease_owner = $11::text,
        lease_until = clock_timestamp() + make_interval(secs => $12::float8),
        next_run_at = clock_timestamp() + make_interval(secs => $12::float8),
        wakeup = false, attempts = 0, last_error = '', updated_at = clock_timestamp()
    WHERE id = $8::uuid AND customer_id = $1 AND state = 'HELD' AND expire_time > clock_timestamp()
      AND EXISTS (SELECT 1 FROM began)
    {_RETURNING}
), first_ev AS (
    INSERT INTO payment_events (checkout_id, source, from_status, to_status, version, trace_id, note)
    SELECT id, 'saga', 'HELD', state, version, $13::text, 'pay ' || $10::text FROM first
)
"""

# CancelCheckout takes the lease whoever held it: every write of the displaced holder is fenced
# by version and owner, and all its remote steps are idempotent, so overriding is safe.
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
      AND (state IN ('HELD', 'AWAITING_ACTION') OR (state = 'CHARGING' AND payment_id IS NOT NULL))
    {_RETURNING}
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note)
    SELECT payment_id, id, 'saga', $5, state, version, $6, 'cancel' FROM upd
)
SELECT * FROM upd
"""

# Workers claim due sagas: SKIP LOCKED so replicas never wait on or double-claim a row; the lease
# is taken and next_run_at pushed to its end in the same statement (a crash leaves the row due
# again when the lease runs out). Each row gets its own owner token.
CLAIM_DUE = """
WITH due AS (
    SELECT id FROM checkouts
    WHERE next_run_at <= clock_timestamp()
    ORDER BY next_run_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
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
HAND_BACK = f"""
UPDATE checkouts SET lease_owner = NULL, lease_until = NULL, wakeup = false, next_run_at = clock_timestamp()
WHERE id = $1 AND lease_owner = $2 AND state NOT IN {_IDLE}
"""

# A failed step: back off ($3 seconds) and let any replica take the next attempt. A finishing step
# (CONFIRMING, RELEASING, REFUNDING) that has now failed $5 times, or for $6 seconds, gives up
# instead: NEEDS_ATTENTION, off the queue, remembering the state to return to, with its event
# (issue 10, item 8). Returns the row's state afterwards.
RETRY_LATER = """
WITH g AS (
    SELECT id, state AS from_state,
           state IN ('CONFIRMING', 'RELEASING', 'REFUNDING')
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
    RETURNING c.id, c.payment_id, c.state, c.version, c.attempts, g.from_state
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note)
    SELECT payment_id, id, 'saga', from_state, state, version, $7,
           'retries exhausted after ' || attempts || ' attempts; an operator may retry'
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
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, version, trace_id, note)
    SELECT payment_id, id, 'saga', 'NEEDS_ATTENTION', state, version, $2, 'retried by ' || $3 FROM upd
), n AS (
    SELECT pg_notify('{WAKE_CHANNEL}', id::text) FROM upd
)
SELECT upd.* FROM upd LEFT JOIN (SELECT count(*) FROM n) notified ON true
"""

# Inside payments' finalize transaction (the transition hook): remember which payment is ours and
# wake the saga. A leased saga gets the `wakeup` flag (its holder looks again before releasing);
# a free one becomes due now and every replica's worker hears the NOTIFY when finalize commits.
WAKE = f"""
WITH upd AS (
    UPDATE checkouts SET
        payment_id = COALESCE(payment_id, $2::uuid),
        wakeup = (lease_until IS NOT NULL AND lease_until > clock_timestamp()),
        next_run_at = CASE WHEN lease_until IS NOT NULL AND lease_until > clock_timestamp()
                           THEN next_run_at ELSE clock_timestamp() END
    WHERE id = $1 AND state NOT IN {_IDLE} AND payment_key IS NOT NULL
      AND (payment_id IS NULL OR payment_id = $2::uuid)
    RETURNING id, wakeup
)
SELECT pg_notify('{WAKE_CHANNEL}', id::text) FROM upd WHERE NOT wakeup
"""

# The same wake-up as CTEs of payments' finalize statement (an in-statement transition hook, see
# payments/core.py): `upd` is the payment row the statement just updated. The payment change, its
# event and the wake-up are then one statement, one commit, one round trip.
WAKE_IN_FINALIZE = (
    ("saga_wake", f"""
    UPDATE checkouts c SET
        payment_id = COALESCE(c.payment_id, upd.id),
        wakeup = (c.lease_until IS NOT NULL AND c.lease_until > clock_timestamp()),
        next_run_at = CASE WHEN c.lease_until IS NOT NULL AND c.lease_until > clock_timestamp()
                           THEN c.next_run_at ELSE clock_timestamp() END
    FROM upd
    WHERE c.id = upd.checkout_id AND c.state NOT IN {_IDLE} AND c.payment_key IS NOT NULL
      AND (c.payment_id IS NULL OR c.payment_id = upd.id)
    RETURNING c.id, c.wakeup
    """),
    ("saga_notify", f"SELECT pg_notify('{WAKE_CHANNEL}', id::text) FROM saga_wake WHERE NOT wakeup"),
)


@dataclass(frozen=True)
class Fields:
    """What a transition may record besides the state."""
    outcome: str | None = None
    hold_id: str | None = None
    amount_minor: int | None = None
    currency: str | None = None
    expire_time: object | None = None
    extended: bool = False
    payment_id: str | None = None
    failure_reason: str = ""
    merchant_id: str | None = None  # recorded once, with the hold (issue 14)


def saga_of(row) -> Saga | None:
    return None if row is None else Saga.from_row(row)


async def insert_pending(conn, *, checkout_id: str, customer_id: str, kind: str, slot_id: str | None,
                         product_id: str | None, quantity: int, owner: str, lease_seconds: float) -> Saga | None:
    order_id = checkout_id if kind == "codes" else None
    return saga_of(await conn.fetchrow(INSERT_PENDING, checkout_id, customer_id, kind, slot_id, product_id,
                                       quantity, order_id, owner, lease_seconds, current_traceparent()))


def insert_pending_with_key(*, kind: str, slot_id: str | None, product_id: str | None, quantity: int, owner: str,
                            lease_seconds: float) -> tuple[str, tuple]:
    return INSERT_PENDING_WITH_KEY, (kind, slot_id, product_id, quantity, owner, lease_seconds, current_traceparent())


def start_charging_with_key(*, checkout_id: str, payment_key: str, payment_method: str, owner: str,
                            lease_seconds: float) -> tuple[str, tuple]:
    return START_CHARGING_WITH_KEY, (checkout_id, payment_key, payment_method, owner, lease_seconds,
                                     current_trace_id())


def saga_of_first(row) -> Saga | None:
    """The saga row a BEGIN_WITH statement returned, or None when its first write wrote nothing."""
    return None if row is None or row["id"] is None else Saga.from_row(row)


async def get(conn, checkout_id: str) -> Saga | None:
    return saga_of(await conn.fetchrow(GET, checkout_id))


async def delete_pending(conn, checkout_id: str, owner: str) -> None:
    await conn.execute(DELETE_PENDING, checkout_id, owner)


async def transition(conn, saga: Saga, owner: str, state: str, fields: Fields = Fields(), note: str = "", *,
                     release: bool = False, wake_at=None, finish=None) -> Saga | None:
    """The new row, or None when fenced (another actor moved the saga or took the lease).
    `release`: give the lease back, due again at `wake_at` (the row's lease_owner then says
    whether it was given back or kept because a wake-up arrived).
    `finish`: (idempotency.KeyFinish, answer): store `answer` under the request's key in the same
    statement if this transition ends the drive (`finish[0].stored` is set when it did)."""
    args = (saga.id, saga.version, owner, state, fields.outcome, fields.hold_id, fields.amount_minor,
            fields.currency, fields.expire_time, fields.extended, fields.payment_id, fields.failure_reason,
            saga.state, current_trace_id(), note, release, wake_at, fields.merchant_id)
    if finish is None:
        return saga_of(await conn.fetchrow(TRANSITION, *args))
    key, answer = finish
    data = answer.SerializeToString()
    row = await conn.fetchrow(TRANSITION_AND_FINISH, *args, data, key.customer, key.operation, key.key)
    if row is not None and row["key_done"]:
        key.stored = data
    return saga_of(row)


def predict(saga: Saga, state: str, fields: Fields) -> Saga:
    """The row TRANSITION writes (`state`, `fields`), as far as a view of it goes: the COALESCEs and
    CASEs of the statement, in Python."""
    def keep(new, old):
        return old if new is None else new
    return dataclasses.replace(
        saga, state=state, outcome=keep(fields.outcome, saga.outcome), hold_id=keep(fields.hold_id, saga.hold_id),
        amount_minor=keep(fields.amount_minor, saga.amount_minor), currency=keep(fields.currency, saga.currency),
        expire_time=keep(fields.expire_time, saga.expire_time), extended=saga.extended or fields.extended,
        payment_id=keep(saga.payment_id, fields.payment_id), merchant_id=keep(saga.merchant_id, fields.merchant_id),
        failure_reason=saga.failure_reason if fields.failure_reason == "" else fields.failure_reason)


async def start_charging(conn, *, checkout_id: str, customer_id: str, payment_key: str, payment_method: str,
                         owner: str, lease_seconds: float) -> Saga | None:
    return saga_of(await conn.fetchrow(START_CHARGING, checkout_id, customer_id, payment_key, payment_method,
                                       owner, lease_seconds, current_trace_id()))


async def start_cancel(conn, *, saga: Saga, owner: str, lease_seconds: float) -> Saga | None:
    return saga_of(await conn.fetchrow(START_CANCEL, saga.id, saga.customer_id, owner, lease_seconds,
                                       saga.state, current_trace_id(), saga.version))


async def claim_due(conn, worker_id: str, limit: int, lease_seconds: float) -> list[Saga]:
    return [Saga.from_row(r) for r in await conn.fetch(CLAIM_DUE, worker_id, limit, lease_seconds)]


async def take_lease(conn, checkout_id: str, owner: str, lease_seconds: float) -> Saga | None:
    return saga_of(await conn.fetchrow(TAKE_LEASE, checkout_id, owner, lease_seconds))


async def heartbeat(conn, checkout_id: str, owner: str, lease_seconds: float) -> bool:
    return (await conn.execute(HEARTBEAT, checkout_id, owner, lease_seconds)) == "UPDATE 1"


async def release(conn, saga: Saga, owner: str, next_run_at) -> Saga | None | bool:
    """True when released; else the re-read row after clearing a wake-up (look again), or None
    when the lease is no longer ours."""
    if (await conn.execute(RELEASE, saga.id, owner, next_run_at)) == "UPDATE 1":
        return True
    return saga_of(await conn.fetchrow(CLEAR_WAKEUP, saga.id, owner))


async def retry_later(conn, saga: Saga, owner: str, delay_seconds: float, error: str, *, max_attempts: int,
                      attention_after_seconds: float) -> str | None:
    """Back off, or hand a finishing step that failed too long to an operator. The saga's state
    afterwards (NEEDS_ATTENTION when it gave up), None when the lease was no longer ours."""
    return await conn.fetchval(RETRY_LATER, saga.id, owner, delay_seconds, error, max_attempts,
                               attention_after_seconds, current_trace_id())


async def retry_by_operator(conn, checkout_id: str, operator: str, merchant: str | None) -> Saga | None:
    """NEEDS_ATTENTION -> the state it left, due now; None when the saga was not waiting for one
    (or is not of `merchant`, when given)."""
    return saga_of(await conn.fetchrow(RETRY_BY_OPERATOR, checkout_id, current_trace_id(), operator, merchant))


async def get_seen_by(pool, checkout_id: str, caller) -> Saga | None:
    """The checkout as a staff or admin user may see it: their merchant's only (issue 14)."""
    return saga_of(await tenancy.fetchrow(pool, GET_SEEN_BY, checkout_id, tenancy.merchant_filter(caller),
                                          principal=caller))


async def hand_back(conn, checkout_id: str, owner: str) -> None:
    await conn.execute(HAND_BACK, checkout_id, owner)


async def wake(conn: asyncpg.Connection, checkout_id: str, payment_id: str) -> None:
    await conn.execute(WAKE, checkout_id, payment_id)
