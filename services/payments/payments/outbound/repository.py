"""The SQL of outbound events, as named constants, and `Endpoints` / `Deliveries` that run them.

The outbox itself has no writer here: the trigger `checkouts_merchant_events` (migrations/functions/)
writes each event and its deliveries in the statement that changes the checkout's state. Every
statement below that protects an invariant is one conditional statement: a claim is
`FOR UPDATE SKIP LOCKED` plus a lease (next_attempt_at pushed to the lease's end), and the end of
an attempt writes only while the worker still owns the lease, appending its log row in the same
statement. Time is the database's.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from cutylib import tenancy
from cutylib.db import reports
from cutylib.principal import Principal

from .secrets import SecretBox, SecretDamaged, default_box

log = logging.getLogger(__name__)

# The secret goes in sealed (secrets.py; the database refuses plaintext).
INSERT_ENDPOINT = """
INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret_key_id, secret_nonce, secret_ciphertext, created_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING merchant_id, id, url, events, created_at
"""
LIST_ENDPOINTS = """
SELECT merchant_id, id, url, events, created_at FROM webhook_endpoints
WHERE merchant_id = $1 ORDER BY created_at DESC, id
"""
GET_ENDPOINT = "SELECT merchant_id, id, url, events, created_at FROM webhook_endpoints WHERE merchant_id = $1 AND id = $2"
DELETE_ENDPOINT = "DELETE FROM webhook_endpoints WHERE merchant_id = $1 AND id = $2 RETURNING id"

# The delivery log of one endpoint, newest first; $3 = 0: the first page, else before that seq.
# Deliveries finished long ago are in the histories (migration 0140, merchant_events_move): both
# are read, each through its log index, and merged; an attempt log is read from where its delivery is.
_DELIVERY_COLUMNS = ("d.merchant_id, d.id, d.seq, d.endpoint_id, d.event_id, d.state, d.attempts, d.next_attempt_at, "
                     "d.lease_owner, d.lease_until, d.give_up_at, d.delivered_at, d.created_at")
_LOG_OF = """
    (SELECT {columns}, e.type AS event_type, {moved} AS moved
       FROM {deliveries} d JOIN {events} e ON e.merchant_id = d.merchant_id AND e.id = d.event_id
      WHERE d.merchant_id = $1 AND d.endpoint_id = $2 AND ($3::bigint = 0 OR d.seq < $3)
      ORDER BY d.seq DESC LIMIT $4)"""
_ATTEMPTS_OF = """
                 SELECT a.attempt, a.started_at, a.http_status, a.error, a.duration_ms FROM {attempts} a
                  WHERE {moved} AND a.merchant_id = d.merchant_id AND a.delivery_id = d.id"""
LIST_DELIVERIES = f"""
WITH d AS ({_LOG_OF.format(columns=_DELIVERY_COLUMNS, moved="false", deliveries="webhook_deliveries",
                           events="merchant_events")}
    UNION ALL{_LOG_OF.format(columns=_DELIVERY_COLUMNS, moved="true", deliveries="webhook_deliveries_history",
                             events="merchant_events_history")}
    ORDER BY seq DESC LIMIT $4
)
SELECT d.*,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                    'attempt', a.attempt, 'started_at', a.started_at, 'http_status', a.http_status,
                    'error', a.error, 'duration_ms', a.duration_ms) ORDER BY a.attempt)
                 FROM ({_ATTEMPTS_OF.format(attempts="webhook_attempts", moved="NOT d.moved")}
                 UNION ALL{_ATTEMPTS_OF.format(attempts="webhook_attempts_history", moved="d.moved")}) a),
                '[]'::jsonb) AS attempt_log
FROM d ORDER BY d.seq DESC
"""
# Manual redelivery: due now, with a fresh retry window, unless an attempt is in flight (its lease
# still runs: two POSTs of one delivery at the same time are what the lease rules out) or the
# endpoint has had $5 redeliveries this minute already. The count is on the endpoint row, in the
# statement that queues the delivery (concurrent redeliveries queue on that row: exactly $5 pass).
# The delivery row is locked before the endpoint row, the order of every statement here that
# writes both (the claim, the end of an attempt): no deadlock between them.
_WINDOW_OVER = "(w.redeliver_window_start IS NULL OR w.redeliver_window_start <= clock_timestamp() - interval '1 minute')"
REDELIVER = f"""
WITH target AS (
    SELECT x.merchant_id, x.id FROM webhook_deliveries x
    WHERE x.merchant_id = $1 AND x.endpoint_id = $2 AND x.id = $3
      AND (x.lease_until IS NULL OR x.lease_until < clock_timestamp())
    FOR UPDATE
), ep AS (
    UPDATE webhook_endpoints w SET
        redeliver_count = CASE WHEN {_WINDOW_OVER} THEN 1 ELSE w.redeliver_count + 1 END,
        redeliver_window_start = CASE WHEN {_WINDOW_OVER} THEN clock_timestamp() ELSE w.redeliver_window_start END
    WHERE w.merchant_id = $1 AND w.id = $2
      AND ({_WINDOW_OVER} OR w.redeliver_count < $5)
      AND EXISTS (SELECT 1 FROM target)
    RETURNING w.id
), d AS (
    UPDATE webhook_deliveries d SET state = 'pending', next_attempt_at = clock_timestamp(), delivered_at = NULL,
           give_up_at = clock_timestamp() + make_interval(secs => $4::float8)
    FROM target WHERE d.merchant_id = target.merchant_id AND d.id = target.id
      AND EXISTS (SELECT 1 FROM ep)
    RETURNING d.*
)
SELECT d.*, e.type AS event_type, '[]'::jsonb AS attempt_log
FROM d JOIN merchant_events e ON e.merchant_id = d.merchant_id AND e.id = d.event_id
"""
# Why a redelivery was not queued: none such, in flight, or over the endpoint's rate ($4 a minute).
REDELIVER_REFUSED = f"""
SELECT d.*, e.type AS event_type, '[]'::jsonb AS attempt_log,
       (d.lease_until IS NOT NULL AND d.lease_until >= clock_timestamp()) AS in_flight,
       (NOT {_WINDOW_OVER} AND w.redeliver_count >= $4) AS limited
FROM webhook_deliveries d
JOIN merchant_events e ON e.merchant_id = d.merchant_id AND e.id = d.event_id
JOIN webhook_endpoints w ON w.merchant_id = d.merchant_id AND w.id = d.endpoint_id
WHERE d.merchant_id = $1 AND d.endpoint_id = $2 AND d.id = $3
"""
NOTIFY_CHANNEL = "cuty_merchant_events"

# The workers' claim, fair across merchants and their endpoints, in one transaction of four statements.
#
# CLAIM_MERCHANTS starts from the merchants whose mark is due (webhook_merchants_due, migration 0310:
# a merchant with a pending delivery has a mark, due no later than its first claimable delivery), so
# it costs what is due, never the merchants that subscribe. Of those it picks the merchants with due
# deliveries on endpoints that may take one now (circuit not open, fewer live leases than the
# endpoint's cap, the merchant under its cap), those served longest ago first, and takes each one's
# claim lock (a transaction-scoped advisory lock; a merchant locked by another worker's claim is
# skipped, not waited for). $1 how many merchants at the most, $2 the endpoint cap, $3 the merchant
# cap, $4 the failures that open the circuit.
#
# CLAIM_DUE then runs under those locks, so no other claim of these merchants runs at the same time,
# and as a new statement it sees every lease committed before the locks were taken: its counts of
# live leases are exact, and the caps hold across every worker of every replica. Per endpoint it
# takes at most (cap - live leases) of the oldest due deliveries (one when half-open: the probe),
# per merchant at most (merchant cap - live leases), interleaving the merchant's endpoints; then the
# batch takes the first delivery of every merchant, then the second, ... up to $2 (round robin).
# Each one is leased to $1 for $3 seconds: the lease pushes next_attempt_at to its end, so a worker
# that dies mid-POST leaves a row due again exactly when the lease runs out (at least once).
# $4 the merchants locked, in their order; $5 the endpoint cap, $6 the merchant cap, $7 the threshold.
#
# REARM_LOCK then locks up to $1 due marks, those re-armed longest ago first (SKIP LOCKED: a mark a
# writer holds stays due). After CLAIM_DUE, never before: a mark is always locked after the
# deliveries and endpoints of the statement that locks it (an attempt's end and a redelivery lock
# their delivery, then the endpoint, then, in their trigger, the mark), so no two wait on each other.
#
# REARM last: each locked mark is due again at its merchant's first pending delivery's
# next_attempt_at (a lease's end for a leased one), an endpoint whose circuit is open counting from
# when it half-opens; a mark with nothing pending is removed. A new statement again, so it sees every
# delivery committed before the marks were locked; one committed later marked its merchant itself.
CLAIM_LOCK_CLASS = 0x77686F6F  # "whoo": this lock's class, apart from every other advisory lock
_LIVE = "l.lease_owner IS NOT NULL AND l.lease_until > clock_timestamp()"
_CLOSED_OR_HALF_OPEN = "(w.circuit_open_until IS NULL OR w.circuit_open_until <= clock_timestamp())"
_ENDPOINT_CAP = "CASE WHEN w.consecutive_failures >= {threshold} THEN 1 ELSE {cap} END"
# Due marks re-armed per claim at the most (the least recently re-armed first).
REARM_BATCH = 100
CLAIM_MERCHANTS = f"""
WITH due AS MATERIALIZED (
    -- now(), the transaction's start: a bound the index can range over (clock_timestamp() is volatile)
    SELECT q.merchant_id FROM webhook_merchants_due q WHERE q.due_at <= now()
), ep AS (
    SELECT w.merchant_id, w.last_claimed_at,
           (SELECT count(*) FROM webhook_deliveries l
            WHERE l.merchant_id = w.merchant_id AND l.endpoint_id = w.id AND {_LIVE}) AS busy,
           {_ENDPOINT_CAP.format(threshold="$4", cap="$2")} AS cap
    FROM due CROSS JOIN LATERAL (
        SELECT w.* FROM webhook_endpoints w WHERE w.merchant_id = due.merchant_id AND {_CLOSED_OR_HALF_OPEN}
        OFFSET 0  -- each due merchant's endpoints by its key, whatever the estimates
    ) w
    WHERE EXISTS (SELECT 1 FROM webhook_deliveries d
                  WHERE d.merchant_id = w.merchant_id AND d.endpoint_id = w.id AND d.next_attempt_at <= clock_timestamp())
), candidates AS MATERIALIZED (
    SELECT ep.merchant_id, max(ep.last_claimed_at) AS served
    FROM ep WHERE ep.busy < ep.cap
    GROUP BY ep.merchant_id
    HAVING (SELECT count(*) FROM webhook_deliveries l WHERE l.merchant_id = ep.merchant_id AND {_LIVE}) < $3
    ORDER BY served NULLS FIRST, ep.merchant_id
)
SELECT merchant_id FROM candidates
WHERE pg_try_advisory_xact_lock({CLAIM_LOCK_CLASS}, hashtext(merchant_id))
LIMIT $1
"""
REARM_LOCK = """
SELECT q.merchant_id FROM webhook_merchants_due q WHERE q.due_at <= now()
ORDER BY q.checked_at NULLS FIRST, q.merchant_id
LIMIT $1
FOR NO KEY UPDATE SKIP LOCKED
"""
REARM = """
WITH nxt AS (
    SELECT m.merchant_id,
           min(CASE WHEN x.at IS NULL THEN NULL
                    WHEN w.circuit_open_until > clock_timestamp() THEN greatest(x.at, w.circuit_open_until)
                    ELSE x.at END) AS due_at
    FROM unnest($1::text[]) AS m(merchant_id)
    LEFT JOIN LATERAL (
        SELECT w.id, w.merchant_id, w.circuit_open_until FROM webhook_endpoints w WHERE w.merchant_id = m.merchant_id
        OFFSET 0
    ) w ON true
    LEFT JOIN LATERAL (
        SELECT d.next_attempt_at AS at FROM webhook_deliveries d
        WHERE d.merchant_id = w.merchant_id AND d.endpoint_id = w.id AND d.next_attempt_at IS NOT NULL
        ORDER BY d.next_attempt_at LIMIT 1
    ) x ON true
    GROUP BY m.merchant_id
), gone AS (
    DELETE FROM webhook_merchants_due q USING nxt
    WHERE q.merchant_id = ANY ($1::text[]) AND q.merchant_id = nxt.merchant_id AND nxt.due_at IS NULL
    RETURNING q.merchant_id
), kept AS (
    UPDATE webhook_merchants_due q SET due_at = nxt.due_at, checked_at = clock_timestamp()
    FROM nxt WHERE q.merchant_id = ANY ($1::text[]) AND q.merchant_id = nxt.merchant_id AND nxt.due_at IS NOT NULL
    RETURNING q.merchant_id
)
SELECT (SELECT count(*) FROM gone) AS removed, (SELECT count(*) FROM kept) AS kept
"""
CLAIM_DUE = f"""
WITH m AS (
    SELECT t.merchant_id, t.ord,
           (SELECT count(*) FROM webhook_deliveries l WHERE l.merchant_id = t.merchant_id AND {_LIVE}) AS busy
    FROM unnest($4::text[]) WITH ORDINALITY AS t(merchant_id, ord)
), ep AS (
    SELECT w.merchant_id, w.id, w.last_claimed_at,
           {_ENDPOINT_CAP.format(threshold="$7", cap="$5")}
           - (SELECT count(*) FROM webhook_deliveries l
              WHERE l.merchant_id = w.merchant_id AND l.endpoint_id = w.id AND {_LIVE}) AS room
    FROM webhook_endpoints w
    WHERE w.merchant_id = ANY ($4::text[]) AND {_CLOSED_OR_HALF_OPEN}
), pick AS (
    SELECT x.merchant_id, x.id, m.ord, m.busy,
           row_number() OVER (PARTITION BY x.merchant_id ORDER BY x.k, ep.last_claimed_at NULLS FIRST, ep.id) AS q
    FROM ep JOIN m ON m.merchant_id = ep.merchant_id
    CROSS JOIN LATERAL (
        SELECT d.merchant_id, d.id, row_number() OVER (ORDER BY d.next_attempt_at) AS k
        FROM webhook_deliveries d
        WHERE d.merchant_id = ep.merchant_id AND d.endpoint_id = ep.id AND d.next_attempt_at <= clock_timestamp()
        ORDER BY d.next_attempt_at
        LIMIT greatest(ep.room, 0)
    ) x
), chosen AS (
    SELECT merchant_id, id FROM pick WHERE q <= $6 - busy ORDER BY q, ord LIMIT $2
), claimed AS (
    UPDATE webhook_deliveries d
    SET lease_owner = $1, lease_until = clock_timestamp() + make_interval(secs => $3::float8),
        next_attempt_at = clock_timestamp() + make_interval(secs => $3::float8), attempts = d.attempts + 1
    FROM chosen WHERE d.merchant_id = chosen.merchant_id AND d.id = chosen.id
      AND d.next_attempt_at <= clock_timestamp()
    RETURNING d.merchant_id, d.id, d.endpoint_id, d.event_id, d.attempts, d.give_up_at
), served AS (
    UPDATE webhook_endpoints w SET last_claimed_at = clock_timestamp()
    FROM (SELECT DISTINCT merchant_id, endpoint_id FROM claimed) c
    WHERE w.merchant_id = c.merchant_id AND w.id = c.endpoint_id
)
SELECT c.*, w.url, w.secret, w.secret_key_id, w.secret_nonce, w.secret_ciphertext,
       e.type AS event_type, e.payload::text AS payload, clock_timestamp() AS db_now
FROM claimed c
JOIN webhook_endpoints w ON w.merchant_id = c.merchant_id AND w.id = c.endpoint_id
JOIN merchant_events e ON e.merchant_id = c.merchant_id AND e.id = c.event_id
"""
# The end of one attempt, only while $3 still owns its lease; the log row and the endpoint's circuit
# in the same statement. $4 delivered; else due again after $5 seconds, or 'failed' once that passes
# give_up_at. The circuit: a success closes it; the $11-th failure in a row opens it for $12 seconds,
# each further failure (a failed half-open probe) for twice as long, at most $13 seconds.
FINISH = """
WITH d AS (
    UPDATE webhook_deliveries SET
        state = CASE WHEN $4 THEN 'delivered'
                     WHEN clock_timestamp() + make_interval(secs => $5::float8) >= give_up_at THEN 'failed'
                     ELSE 'pending' END,
        next_attempt_at = CASE WHEN $4 THEN NULL
                               WHEN clock_timestamp() + make_interval(secs => $5::float8) >= give_up_at THEN NULL
                               ELSE clock_timestamp() + make_interval(secs => $5::float8) END,
        delivered_at = CASE WHEN $4 THEN clock_timestamp() END,
        lease_owner = NULL, lease_until = NULL
    WHERE merchant_id = $1 AND id = $2 AND lease_owner = $3
    RETURNING merchant_id, id, endpoint_id, state
), circuit AS (
    UPDATE webhook_endpoints w SET
        consecutive_failures = CASE WHEN $4 THEN 0 ELSE least(w.consecutive_failures + 1, 1000000) END,
        circuit_open_until = CASE
            WHEN $4 THEN NULL
            WHEN w.consecutive_failures + 1 >= $11 THEN clock_timestamp() + make_interval(secs => least(
                $13::float8, $12::float8 * power(2, least(w.consecutive_failures + 1 - $11, 30))))
            ELSE w.circuit_open_until END
    FROM d WHERE w.merchant_id = d.merchant_id AND w.id = d.endpoint_id
    RETURNING w.consecutive_failures
)
INSERT INTO webhook_attempts (merchant_id, delivery_id, attempt, worker, started_at, http_status, error, duration_ms)
SELECT d.merchant_id, d.id, $6, $3, $7, $8, $9, $10 FROM d
ON CONFLICT DO NOTHING
RETURNING (SELECT state FROM d) AS state, (SELECT consecutive_failures FROM circuit) AS failures
"""
# The delivery gauges (refreshed): due now and the oldest due one's wait; circuits open now.
GAUGES = """
SELECT (SELECT count(*) FROM webhook_deliveries WHERE next_attempt_at <= clock_timestamp()) AS backlog,
       (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(next_attempt_at)), 0)
        FROM webhook_deliveries WHERE next_attempt_at <= clock_timestamp()) AS oldest_due_age,
       (SELECT count(*) FROM webhook_endpoints
        WHERE circuit_open_until IS NOT NULL AND circuit_open_until > clock_timestamp()) AS circuits_open
"""


@dataclass(frozen=True)
class Endpoint:
    merchant_id: str
    id: str
    url: str
    events: list[str]
    created_at: datetime
    secret: str = ""

    @classmethod
    def from_row(cls, row, secret: str = "") -> "Endpoint":
        return cls(row["merchant_id"], str(row["id"]), row["url"], list(row["events"]), row["created_at"], secret)


@dataclass(frozen=True)
class Delivery:
    """A delivery as the log shows it."""
    id: str
    seq: int
    endpoint_id: str
    event_id: str
    event_type: str
    state: str
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    attempt_log: list[dict]

    @classmethod
    def from_row(cls, row) -> "Delivery":
        log = row["attempt_log"]
        log = json.loads(log) if isinstance(log, str) else (log or [])
        return cls(str(row["id"]), row["seq"], str(row["endpoint_id"]), str(row["event_id"]), row["event_type"],
                   row["state"], row["attempts"], row["created_at"],
                   row["next_attempt_at"] if row["state"] == "pending" else None, row["delivered_at"], log)


@dataclass(frozen=True)
class Claimed:
    """A delivery leased to a worker, with what it needs to POST it."""
    merchant_id: str
    id: str
    endpoint_id: str
    event_id: str
    event_type: str
    attempt: int
    url: str
    secret: str | None  # None: the stored secret did not open (SecretDamaged): never POSTed
    payload: bytes
    db_now: datetime


class Endpoints:
    """The admins' statements, each inside `tenancy.scoped` (RLS as the second line)."""

    def __init__(self, pool: asyncpg.Pool, box: SecretBox | None = None):
        self.pool = pool
        self.box = box or default_box()

    async def insert(self, caller: Principal, merchant: str, endpoint_id: str, url: str, events: list[str],
                     secret: str) -> Endpoint:
        key_id, nonce, sealed = self.box.seal(merchant, endpoint_id, secret)
        async with tenancy.scoped(self.pool, caller) as uow:
            row = await uow.conn.fetchrow(INSERT_ENDPOINT, merchant, endpoint_id, url, events, key_id, nonce, sealed,
                                          caller.subject)
            await uow.commit()
        return Endpoint.from_row(row, secret)

    async def list(self, caller: Principal, merchant: str) -> list[Endpoint]:
        return [Endpoint.from_row(r) for r in await tenancy.fetch(self.pool, LIST_ENDPOINTS, merchant,
                                                                   principal=caller)]

    async def get(self, caller: Principal, merchant: str, endpoint_id: str) -> Endpoint | None:
        row = await tenancy.fetchrow(self.pool, GET_ENDPOINT, merchant, endpoint_id, principal=caller)
        return Endpoint.from_row(row) if row else None

    async def delete(self, caller: Principal, merchant: str, endpoint_id: str) -> bool:
        async with tenancy.scoped(self.pool, caller) as uow:
            gone = await uow.conn.fetchval(DELETE_ENDPOINT, merchant, endpoint_id)
            await uow.commit()
        return gone is not None

    async def deliveries(self, caller: Principal, merchant: str, endpoint_id: str, before_seq: int,
                         limit: int) -> list[Delivery]:
        rows = await tenancy.fetch(reports(self.pool), LIST_DELIVERIES, merchant, endpoint_id, before_seq, limit,
                                   principal=caller)
        return [Delivery.from_row(r) for r in rows]

    async def redeliver(self, caller: Principal, merchant: str, endpoint_id: str, delivery_id: str,
                        window_seconds: float, per_minute: int) -> tuple[Delivery | None, str]:
        """(the delivery, "queued" | "in_flight" | "rate_limited"); (None, "") when there is none."""
        async with tenancy.scoped(self.pool, caller) as uow:
            row = await uow.conn.fetchrow(REDELIVER, merchant, endpoint_id, delivery_id, window_seconds, per_minute)
            outcome = "queued"
            if row is None:
                row = await uow.conn.fetchrow(REDELIVER_REFUSED, merchant, endpoint_id, delivery_id, per_minute)
                outcome = "" if row is None else "in_flight" if row["in_flight"] else "rate_limited"
            await uow.commit()
        return (Delivery.from_row(row) if row else None), outcome


@dataclass(frozen=True)
class Limits:
    """What one merchant may take of the delivery workers, across every replica (the database counts)."""
    endpoint_in_flight: int = 4       # live leases of one endpoint
    merchant_in_flight: int = 8       # live leases of all of one merchant's endpoints
    circuit_failures: int = 5         # failed attempts in a row that open an endpoint's circuit
    circuit_open_seconds: float = 30.0      # the first time; doubled by each failed half-open probe
    circuit_max_open_seconds: float = 600.0


@dataclass(frozen=True)
class Finished:
    state: str                # the delivery's: delivered | pending | failed
    circuit_opened: bool      # this attempt was the failure that opened the endpoint's circuit


class Deliveries:
    """The workers' statements (the orchestrator's own unit of work: every merchant)."""

    def __init__(self, pool: asyncpg.Pool, box: SecretBox | None = None, limits: Limits | None = None):
        self.pool = pool
        self.box = box or default_box()
        self.limits = limits or Limits()

    async def claim_due(self, worker_id: str, limit: int, lease_seconds: float) -> list[Claimed]:
        """Up to `limit` due deliveries, leased to `worker_id`, within every merchant's and endpoint's
        cap (CLAIM_MERCHANTS, CLAIM_DUE, REARM_LOCK, REARM: one transaction, so the claim locks last
        until the leases are committed)."""
        lim = self.limits
        rows = []
        async with self.pool.acquire() as conn, conn.transaction():
            merchants = [r["merchant_id"] for r in await conn.fetch(
                CLAIM_MERCHANTS, limit, lim.endpoint_in_flight, lim.merchant_in_flight, lim.circuit_failures)]
            if merchants:
                rows = await conn.fetch(CLAIM_DUE, worker_id, limit, lease_seconds, merchants,
                                        lim.endpoint_in_flight, lim.merchant_in_flight, lim.circuit_failures)
            rearm = [r["merchant_id"] for r in await conn.fetch(REARM_LOCK, REARM_BATCH)]
            if rearm:
                await conn.fetchrow(REARM, rearm)
        return [Claimed(r["merchant_id"], str(r["id"]), str(r["endpoint_id"]), str(r["event_id"]), r["event_type"],
                        r["attempts"], r["url"], self._secret(r), r["payload"].encode(), r["db_now"]) for r in rows]

    def _secret(self, row) -> str | None:
        try:
            return self.box.secret_of(row)
        except SecretDamaged as e:
            log.error("webhook endpoint secret failed its integrity check",
                      extra={"endpoint_id": str(row["endpoint_id"]), "error": str(e)})
            return None

    async def finish(self, c: Claimed, worker_id: str, *, delivered: bool, retry_in: float, started_at: datetime,
                     http_status: int, error: str, duration_ms: int) -> Finished | None:
        """The delivery's state after this attempt, or None when the lease was lost (nothing written)."""
        lim = self.limits
        row = await self.pool.fetchrow(FINISH, c.merchant_id, c.id, worker_id, delivered, retry_in, c.attempt,
                                       started_at, http_status, error[:500], duration_ms, lim.circuit_failures,
                                       lim.circuit_open_seconds, lim.circuit_max_open_seconds)
        if row is None or row["state"] is None:
            return None
        return Finished(row["state"], not delivered and row["failures"] == lim.circuit_failures)

    async def gauges(self) -> dict:
        """Due deliveries, the oldest due one's wait in seconds, open circuits (every merchant)."""
        row = await self.pool.fetchrow(GAUGES)
        return {"backlog": row["backlog"], "oldest_due_age": float(row["oldest_due_age"]),
                "circuits_open": row["circuits_open"]}
