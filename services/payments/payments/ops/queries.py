"""The operator's reads: SQL on the payments database (so they work while gRPC is down), gathered
into a checkout's `Story` or the list of stuck checkouts."""
from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from ..checkout import domain as saga_domain
from ..checkout.diagnostics import trace_id_of
from ..checkout.repository import in_list
from .diagnosis import STEP_OF_STATE, diagnose

TRACE_URL_TEMPLATE = "CUTY_TRACE_URL_TEMPLATE"

# Whichever id the on-call engineer has: each row names what matched. Idempotency-Keys of the
# checkout API are unique per customer only, so one may match several checkouts.
FIND = """
SELECT 'checkout id' AS matched, c.id AS checkout_id, c.payment_id FROM checkouts c WHERE c.id = $2::uuid
UNION ALL
SELECT 'payment id', p.checkout_id, p.id FROM payments p WHERE p.id = $2::uuid
UNION ALL
SELECT 'PSP intent id', p.checkout_id, p.id FROM payments p WHERE p.psp_intent_id = $1
UNION ALL
SELECT 'payment attempt id (PSP Idempotency-Key)', p.checkout_id, p.id FROM payments p WHERE p.idempotency_key = $1
UNION ALL
SELECT 'Idempotency-Key of ' || k.operation || ' by ' || k.customer_id, k.resource_id, NULL
FROM checkout_idempotency_keys k WHERE k.key = $1
LIMIT 20
"""

CHECKOUT = """
SELECT *, clock_timestamp() AS db_now,
       extract(epoch FROM clock_timestamp() - updated_at) AS state_age_seconds
FROM checkouts WHERE id = $1
"""

PAYMENTS = """
SELECT id, checkout_id, customer_id, status, version, psp_intent_id, psp_refund_id, amount_minor, currency,
       payment_method, idempotency_key, failure_reason, lease_owner, lease_until, reconcile_at,
       reconcile_attempts, created_at, updated_at
FROM payments WHERE id = ANY($1::uuid[]) OR ($2::uuid IS NOT NULL AND checkout_id = $2::uuid)
ORDER BY created_at
"""

TIMELINE = """
SELECT seq, payment_id, checkout_id, source, from_status, to_status, version, trace_id, note, created_at
FROM payment_events
WHERE ($1::uuid IS NOT NULL AND checkout_id = $1::uuid) OR payment_id = ANY($2::uuid[])
ORDER BY seq
"""

PSP_EVENTS = """
SELECT event_id, type, payment_id, status, attempts, last_error, received_at, processed_at
FROM psp_events WHERE payment_id = ANY($1::uuid[]) ORDER BY received_at, event_id
"""

# The payments' disputes (docs/payments.md, "Disputes"): status, amount, deadline, the evidence sent.
DISPUTES = """
SELECT id, psp_dispute_id, payment_id, status, amount_minor, currency, reason, evidence_due_by,
       evidence_submitted_at, closed_at, attempts, last_error, evidence
FROM disputes WHERE payment_id = ANY($1::uuid[]) ORDER BY created_at, id
"""

# Sagas not finished (NEEDS_ATTENTION included) whose state is older than $1 seconds, the oldest $2,
# picked among the live sagas (migration 0330, kept in the statement that changes a checkout), as the
# stuck-saga gauges are; only those are read from checkouts.
STUCK = f"""
SELECT c.id, c.kind, c.state, c.attention_from, c.attempts, c.last_error, c.failing_since, c.updated_at,
       c.created_at, c.payment_id, p.status AS payment_status, p.psp_intent_id,
       extract(epoch FROM clock_timestamp() - c.updated_at) AS age_seconds
FROM (SELECT checkout_id, updated_at FROM sagas_live
      WHERE state NOT IN {in_list(saga_domain.TERMINAL)}
        AND updated_at < clock_timestamp() - make_interval(secs => $1::float8)
      ORDER BY updated_at
      LIMIT $2) l
JOIN checkouts c ON c.id = l.checkout_id
LEFT JOIN payments p ON p.id = c.payment_id
ORDER BY l.updated_at
"""

_STEP_NOTE = re.compile(r"^(?P<step>[a-z_]+) (?P<ms>\d+(?:\.\d+)?)ms$")


def trace_link(trace_id: str, template: str | None = None) -> str:
    template = os.environ.get(TRACE_URL_TEMPLATE, "") if template is None else template
    return template.replace("{trace_id}", trace_id) if template and trace_id else ""


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):  # extract(epoch ...)
        return float(value)
    return value


def _plain(row) -> dict[str, Any]:
    return {k: jsonable(v) for k, v in dict(row).items()}


def uuid_or_none(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


@dataclass
class Story:
    """Everything known about one checkout (or a payment without one), gathered by `story()`."""
    query: str
    matched: list[str]
    checkout: dict[str, Any] | None
    payments: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    psp_events: list[dict[str, Any]]
    trace_ids: list[str] = field(default_factory=list)
    trace_links: list[str] = field(default_factory=list)
    disputes: list[dict[str, Any]] = field(default_factory=list)
    failing_step: str = ""
    diagnosis: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "matched": self.matched, "diagnosis": self.diagnosis,
                "failing_step": self.failing_step, "checkout": self.checkout, "payments": self.payments,
                "timeline": self.timeline, "psp_events": self.psp_events, "trace_ids": self.trace_ids,
                "trace_links": self.trace_links, "disputes": self.disputes}


async def find(conn, query: str) -> list[tuple[str, str | None, str | None]]:
    """(what matched, checkout id, payment id) for every row `query` names."""
    rows = await conn.fetch(FIND, query, uuid_or_none(query))
    return [(r["matched"], jsonable(r["checkout_id"]), jsonable(r["payment_id"])) for r in rows]


async def story(conn, query: str) -> list[Story]:
    """The stories of everything `query` names (usually one), as data."""
    query = query.strip()
    groups: dict[tuple[str | None, str | None], list[str]] = {}
    for matched, checkout_id, payment_id in await find(conn, query):
        key = (checkout_id, None) if checkout_id else (None, payment_id)
        groups.setdefault(key, []).append(matched)
    return [await _story_of(conn, query, matched, checkout_id, payment_id)
            for (checkout_id, payment_id), matched in groups.items()]


async def _story_of(conn, query: str, matched: list[str], checkout_id: str | None, payment_id: str | None) -> Story:
    row = await conn.fetchrow(CHECKOUT, uuid.UUID(checkout_id)) if checkout_id else None
    checkout = _plain(row) if row is not None else None
    if checkout is not None:
        checkout["trace_id"] = trace_id_of(row["traceparent"])
    known = [uuid.UUID(p) for p in {payment_id, checkout and checkout.get("payment_id")} if p]
    payments = [_plain(r) for r in await conn.fetch(PAYMENTS, known, uuid.UUID(checkout_id) if checkout_id else None)]
    ids = [uuid.UUID(p["id"]) for p in payments]
    events = [_plain(r) for r in await conn.fetch(TIMELINE, uuid.UUID(checkout_id) if checkout_id else None, ids)]
    previous = None
    for e in events:
        m = _STEP_NOTE.match(e["note"] or "")
        e["step"], e["step_ms"] = (m["step"], float(m["ms"])) if m else ("", None)
        at = datetime.fromisoformat(e["created_at"].replace("Z", "+00:00"))
        e["since_previous_ms"] = round((at - previous).total_seconds() * 1000, 1) if previous else None
        previous = at
    psp = [_plain(r) for r in await conn.fetch(PSP_EVENTS, ids)] if ids else []
    disputes = [_plain(r) for r in await conn.fetch(DISPUTES, ids)] if ids else []
    traces = []
    for t in [checkout and checkout.get("trace_id")] + [e["trace_id"] for e in events]:
        if t and t not in traces:
            traces.append(t)
    out = Story(query=query, matched=matched, checkout=checkout, payments=payments, timeline=events,
                psp_events=psp, trace_ids=traces, trace_links=[link for link in map(trace_link, traces) if link],
                disputes=disputes)
    out.failing_step, out.diagnosis = diagnose(checkout, payments)
    return out


async def stuck(conn, older_than: float, limit: int = 200) -> list[dict[str, Any]]:
    rows = [_plain(r) for r in await conn.fetch(STUCK, float(older_than), limit)]
    for r in rows:
        r["step"] = STEP_OF_STATE.get(r["attention_from"] or r["state"], "")
    return rows
