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
LIST_DELIVERIES = """
SELECT d.*, e.type AS event_type,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                    'attempt', a.attempt, 'started_at', a.started_at, 'http_status', a.http_status,
                    'error', a.error, 'duration_ms', a.duration_ms) ORDER BY a.attempt)
                 FROM webhook_attempts a WHERE a.merchant_id = d.merchant_id AND a.delivery_id = d.id),
                '[]'::jsonb) AS attempt_log
FROM webhook_deliveries d
JOIN merchant_events e ON e.merchant_id = d.merchant_id AND e.id = d.event_id
WHERE d.merchant_id = $1 AND d.endpoint_id = $2 AND ($3::bigint = 0 OR d.seq < $3)
ORDER BY d.seq DESC LIMIT $4
"""
GET_DELIVERY = """
SELECT d.*, e.type AS event_type, '[]'::jsonb AS attempt_log
FROM webhook_deliveries d JOIN merchant_events e ON e.merchant_id = d.merchant_id AND e.id = d.event_id
WHERE d.merchant_id = $1 AND d.endpoint_id = $2 AND d.id = $3
"""
# Manual redelivery: due now, with a fresh retry window, unless an attempt is in flight (its lease
# still runs): two POSTs of one delivery at the same time are what the lease rules out.
REDELIVER = """
WITH d AS (
    UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = clock_timestamp(), delivered_at = NULL,
           give_up_at = clock_timestamp() + make_interval(secs => $4::float8)
    WHERE merchant_id = $1 AND endpoint_id = $2 AND id = $3
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    RETURNING *
)
SELECT d.*, e.type AS event_type, '[]'::jsonb AS attempt_log
FROM d JOIN merchant_events e ON e.merchant_id = d.merchant_id AND e.id = d.event_id
"""
NOTIFY_CHANNEL = "cuty_merchant_events"

# The workers' claim: the oldest due deliveries nobody holds, leased to $1 for $3 seconds. The
# lease pushes next_attempt_at to its end, so a worker that dies mid-POST leaves a row that is due
# again exactly when the lease runs out (at least once); while it runs nobody else may claim it.
CLAIM_DUE = """
WITH due AS (
    SELECT merchant_id, id FROM webhook_deliveries
    WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= clock_timestamp()
    ORDER BY next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE webhook_deliveries d
    SET lease_owner = $1, lease_until = clock_timestamp() + make_interval(secs => $3::float8),
        next_attempt_at = clock_timestamp() + make_interval(secs => $3::float8), attempts = d.attempts + 1
    FROM due WHERE d.merchant_id = due.merchant_id AND d.id = due.id
    RETURNING d.merchant_id, d.id, d.endpoint_id, d.event_id, d.attempts, d.give_up_at
)
SELECT c.*, w.url, w.secret, w.secret_key_id, w.secret_nonce, w.secret_ciphertext,
       e.type AS event_type, e.payload::text AS payload, clock_timestamp() AS db_now
FROM claimed c
JOIN webhook_endpoints w ON w.merchant_id = c.merchant_id AND w.id = c.endpoint_id
JOIN merchant_events e ON e.merchant_id = c.merchant_id AND e.id = c.event_id
"""
# The end of one attempt, only while $3 still owns its lease; the log row in the same statement.
# $4 delivered; else due again after $5 seconds, or 'failed' once that passes give_up_at.
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
    RETURNING merchant_id, id, state
)
INSERT INTO webhook_attempts (merchant_id, delivery_id, attempt, worker, started_at, http_status, error, duration_ms)
SELECT d.merchant_id, d.id, $6, $3, $7, $8, $9, $10 FROM d
ON CONFLICT DO NOTHING
RETURNING (SELECT state FROM d)
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
        rows = await tenancy.fetch(self.pool, LIST_DELIVERIES, merchant, endpoint_id, before_seq, limit,
                                   principal=caller)
        return [Delivery.from_row(r) for r in rows]

    async def redeliver(self, caller: Principal, merchant: str, endpoint_id: str, delivery_id: str,
                        window_seconds: float) -> tuple[Delivery | None, bool]:
        """(the delivery, whether it was queued again); (None, False) when there is none."""
        async with tenancy.scoped(self.pool, caller) as uow:
            row = await uow.conn.fetchrow(REDELIVER, merchant, endpoint_id, delivery_id, window_seconds)
            queued = row is not None
            if row is None:
                row = await uow.conn.fetchrow(GET_DELIVERY, merchant, endpoint_id, delivery_id)
            await uow.commit()
        return (Delivery.from_row(row) if row else None), queued


class Deliveries:
    """The workers' statements (the orchestrator's own unit of work: every merchant)."""

    def __init__(self, pool: asyncpg.Pool, box: SecretBox | None = None):
        self.pool = pool
        self.box = box or default_box()

    async def claim_due(self, worker_id: str, limit: int, lease_seconds: float) -> list[Claimed]:
        rows = await self.pool.fetch(CLAIM_DUE, worker_id, limit, lease_seconds)
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
                     http_status: int, error: str, duration_ms: int) -> str | None:
        """The delivery's state after this attempt, or None when the lease was lost (nothing written)."""
        return await self.pool.fetchval(FINISH, c.merchant_id, c.id, worker_id, delivered, retry_in, c.attempt,
                                        started_at, http_status, error[:500], duration_ms)
