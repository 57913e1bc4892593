"""The operator's view: `python -m payments ops <command>`, run in a payments pod.

    python -m payments ops story <checkout id | payment id | PSP intent id | idempotency key> [--json]
    python -m payments ops stuck [--older-than SECONDS] [--json]
    python -m payments ops retry <checkout id> --by <who>
    python -m payments ops refund <payment id> --by <who> [--reason TEXT] [--force]

`story` and `stuck` only read: SQL on the payments database (CUTY_PAYMENTS_DATABASE_URL, or
CUTY_DATABASE_URL's cuty_payments), so they work while gRPC is down. `retry` and `refund` change
things, so they go through the payments gRPC API (CUTY_PAYMENTS_ADDR) as the payments service's own
identity (its certificate, in its pod: the principal `system`): the same code path, checks and
idempotency keys as everything else, never a hand-written UPDATE. `--by` travels as metadata
`cuty-operator`, which the service honours only from `system` (payments/operator.py), and lands in
the timeline: "retried by ops:<who>", "refund requested by ops:<who>: <reason>".

CUTY_TRACE_URL_TEMPLATE (e.g. `http://jaeger:16686/trace/{trace_id}`) turns trace ids into links.
docs/observability.md has the runbook ("On call: customer charged but no booking").
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import asyncpg

from .checkout import domain as saga_domain
from .checkout.diagnostics import trace_id_of
from .checkout.repository import in_list

TRACE_URL_TEMPLATE = "CUTY_TRACE_URL_TEMPLATE"
OPERATOR_KEY = "cuty-operator"  # payments.operator.OPERATOR_KEY (not imported: keeps the reads light)
DEFAULT_STUCK_SECONDS = 60.0

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

# Sagas not finished (NEEDS_ATTENTION included) whose state is older than $1 seconds; the partial
# index checkouts_live_by_state covers it, as it does the stuck-saga gauges.
STUCK = f"""
SELECT c.id, c.kind, c.state, c.attention_from, c.attempts, c.last_error, c.failing_since, c.updated_at,
       c.created_at, c.payment_id, p.status AS payment_status, p.psp_intent_id,
       extract(epoch FROM clock_timestamp() - c.updated_at) AS age_seconds
FROM checkouts c LEFT JOIN payments p ON p.id = c.payment_id
WHERE c.state NOT IN {in_list(saga_domain.TERMINAL)}
  AND c.updated_at < clock_timestamp() - make_interval(secs => $1::float8)
ORDER BY c.updated_at
LIMIT $2
"""

# What the step of each state does, in words an on-call engineer can act on.
STEP_OF_STATE = {
    "PENDING": "hold (booking.HoldSlot / codepool.ReserveCodes)",
    "HELD": "none: waiting for the customer to pay (until the hold expires)",
    "CHARGING": "charge (PSP payment intent), then reading the payment's outcome",
    "AWAITING_ACTION": "none: waiting for the customer's 3-D Secure (or the PSP's webhook)",
    "CONFIRMING": "confirm (booking.ConfirmHold / codepool.DeliverCodes)",
    "RELEASING": "cancel the PSP intent, then release the hold / reservation",
    "REFUNDING": "refund (PSP refund), then release the hold / reservation",
    "CANCELLING": "cancel after purchase: refund per the policy (PSP refund), then booking.CancelBooking",
    "RESCHEDULING": "reschedule: booking.HoldSlot of the new slot, then the PSP charge of a price increase",
    "RESCHEDULE_CONFIRMING": "reschedule: booking.ConfirmHold (new), booking.CancelBooking (old), refund a decrease",
    "RESCHEDULE_REVERTING": "reschedule undone: cancel / refund the difference's payment, booking.ReleaseHold (new)",
}
_STEP_NOTE = re.compile(r"^(?P<step>[a-z_]+) (?P<ms>\d+(?:\.\d+)?)ms$")


def trace_link(trace_id: str, template: str | None = None) -> str:
    template = os.environ.get(TRACE_URL_TEMPLATE, "") if template is None else template
    return template.replace("{trace_id}", trace_id) if template and trace_id else ""


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):  # extract(epoch ...)
        return float(value)
    return value


def _plain(row) -> dict[str, Any]:
    return {k: _iso(v) for k, v in dict(row).items()}


def _uuid_or_none(value: str) -> uuid.UUID | None:
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
    rows = await conn.fetch(FIND, query, _uuid_or_none(query))
    return [(r["matched"], _iso(r["checkout_id"]), _iso(r["payment_id"])) for r in rows]


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


def diagnose(checkout: dict | None, payments: list[dict]) -> tuple[str, str]:
    """(the step that is failing or '' , one paragraph: where it stands and what to do)."""
    captured = [p for p in payments if p["status"] in ("succeeded", "partially_refunded", "refunded")]
    if checkout is None:
        if not payments:
            return "", "nothing found"
        p = payments[-1]
        return "", f"a payment without a checkout, {p['status']}; refund by hand only if it was taken in error"
    state, cid = checkout["state"], checkout["id"]
    attempts, error = checkout.get("attempts") or 0, checkout.get("last_error") or ""
    step = STEP_OF_STATE.get(checkout.get("attention_from") or state, "")
    failing = f"{step}: failed {attempts} time(s) in a row since {checkout.get('failing_since')}; " \
              f"last error: {error}" if attempts else ""
    if state == "COMPLETED":
        return "", "completed: paid and confirmed (booking confirmed / codes delivered)"
    if state == "REFUNDED":
        return "", "refunded: the customer was charged and the money was returned (see the refund in the timeline)"
    if state in ("FAILED", "EXPIRED", "CANCELLED", "REJECTED"):
        if any(p["status"] in ("succeeded", "partially_refunded") for p in captured):
            return "", (f"{state} but a payment is captured and not refunded: this breaks 'every capture ends as "
                        f"one completion or one refund'. Escalate; `ops refund <payment id> --by <you>` returns "
                        f"the money")
        return "", f"{state.lower()}: nothing was charged (or it was given back); no action needed"
    if state == "NEEDS_ATTENTION":
        return step, (f"NEEDS ATTENTION: the step '{step}' failed {attempts} times and stopped retrying; "
                      f"last error: {error}. Fix the cause, then `python -m payments ops retry {cid} --by <you>` "
                      f"(the saga repeats the step with the same idempotency key)."
                      + (" The customer has been charged." if captured else ""))
    if attempts:
        return step, (f"{state}, retrying by itself: {failing}."
                      + (" The customer has been charged and has no booking yet." if captured else "")
                      + " It moves to NEEDS_ATTENTION if it keeps failing (CUTY_SAGA_MAX_ATTEMPTS).")
    return "", f"{state}: in progress, no failure recorded; current step: {step or 'none'}"


def render(s: Story) -> str:
    """The story as text, newest facts first where it matters, for someone who did not write the code."""
    lines: list[str] = []
    add = lines.append
    c = s.checkout
    add(f"== {s.query}: matched {', '.join(s.matched)}")
    add(f"   {s.diagnosis}")
    if s.failing_step:
        add(f"   failing step: {s.failing_step}")
    add("")
    if c is not None:
        add(f"checkout {c['id']}  kind {c['kind']}  state {c['state']}"
            + (f" (from {c['attention_from']})" if c.get("attention_from") else "")
            + (f"  outcome {c['outcome']}" if c.get("outcome") else ""))
        add(f"  customer {c['customer_id']}  created {c['created_at']}  in this state since {c['updated_at']} "
            f"({float(c['state_age_seconds']):.0f} s)  version {c['version']}")
        add(f"  attempts {c['attempts']}  last error: {c['last_error'] or '-'}"
            + (f"  failing since {c['failing_since']}" if c.get("failing_since") else ""))
        add(f"  failure reason: {c['failure_reason'] or '-'}  next run: {c['next_run_at'] or '-'}"
            f"  lease: {c.get('lease_owner') or '-'}")
        target = f"slot {c['slot_id']} hold {c['hold_id']}" if c["kind"] == "booking" else \
            f"product {c['product_id']} x{c['quantity']} order {c['order_id']}"
        amount = f"{c['amount_minor']} {c['currency']} (minor units)" if c.get("amount_minor") is not None else "-"
        add(f"  {target}  amount {amount}  hold expires {c['expire_time'] or '-'}")
        if c["kind"] == "codes":
            add(f"  the codes' story (in a code pool pod): python -m codepool ops code {c['order_id']} --by <you>")
    for p in s.payments:
        add(f"payment {p['id']}  status {p['status']}  version {p['version']}  method {p['payment_method']}")
        add(f"  PSP intent {p['psp_intent_id'] or '- (the PSP has not answered)'}  refund {p['psp_refund_id'] or '-'}"
            f"  amount {p['amount_minor']} {p['currency']}  failure {p['failure_reason'] or '-'}")
        add(f"  attempt id / PSP Idempotency-Key {p['idempotency_key']}  reconcile at {p['reconcile_at'] or '-'}")
    add("")
    add("timeline (payment_events; saga = checkout transitions, sync/webhook/reconcile = payment changes):")
    for e in s.timeline:
        what = f"{e['from_status'] or '(new)'} -> {e['to_status']}"
        took = f"  step {e['step']} {e['step_ms']:.1f} ms" if e["step"] else ""
        gap = f"+{e['since_previous_ms'] / 1000:.3f}s" if e["since_previous_ms"] is not None else ""
        note = f"  [{e['note']}]" if e["note"] and not e["step"] else ""
        add(f"  {e['created_at']} {gap:>9}  {e['source']:<9} {what:<34}{took}{note}  trace {e['trace_id'] or '-'}")
    if not s.timeline:
        add("  (none)")
    if s.psp_events:
        add("PSP webhooks received:")
        for w in s.psp_events:
            add(f"  {w['received_at']}  {w['type']:<28} {w['status']:<9} attempts {w['attempts']}"
                + (f"  last error: {w['last_error']}" if w["last_error"] else "") + f"  ({w['event_id']})")
    for d in s.disputes:
        evidence = "evidence submitted " + str(d["evidence_submitted_at"]) if d["evidence_submitted_at"] else (
            "no evidence submitted" + (f" (last error: {d['last_error']})" if d["last_error"] else ""))
        add(f"DISPUTE {d['psp_dispute_id']}: {d['status'].upper()} {d['amount_minor']} {d['currency']} minor units"
            f" ({d['reason'] or 'no reason'}), evidence due by {d['evidence_due_by']}; {evidence}"
            + (f"; closed {d['closed_at']}" if d["closed_at"] else ""))
    add("")
    add("trace ids: " + (", ".join(s.trace_ids) or "-"))
    for link in s.trace_links:
        add(f"  {link}")
    if not s.trace_links and s.trace_ids:
        add(f"  (set {TRACE_URL_TEMPLATE}, e.g. http://jaeger:16686/trace/{{trace_id}}, for links)")
    return "\n".join(lines)


async def stuck(conn, older_than: float, limit: int = 200) -> list[dict[str, Any]]:
    rows = [_plain(r) for r in await conn.fetch(STUCK, float(older_than), limit)]
    for r in rows:
        r["step"] = STEP_OF_STATE.get(r["attention_from"] or r["state"], "")
    return rows


def render_stuck(rows: list[dict[str, Any]], older_than: float) -> str:
    if not rows:
        return f"no checkout has been in a non-terminal state for more than {older_than:g} s"
    out = [f"{len(rows)} checkout(s) in a non-terminal state for more than {older_than:g} s (oldest first):"]
    for r in rows:
        state = r["state"] + (f"(from {r['attention_from']})" if r["attention_from"] else "")
        out.append(f"  {r['id']}  {state:<32} {float(r['age_seconds']):>8.0f} s  attempts {r['attempts']:<3} "
                   f"payment {r['payment_status'] or '-'}  intent {r['psp_intent_id'] or '-'}"
                   + (f"  last error: {r['last_error']}" if r["last_error"] else ""))
    out.append("next: python -m payments ops story <checkout id>")
    return "\n".join(out)


# -- changes, through the gRPC API as the payments identity -----------------------------------------

# A refund by hand is fine where the saga is (or was) giving the money back anyway; elsewhere it may
# leave a confirmed booking refunded or race a confirm, so it needs --force.
REFUND_WITHOUT_FORCE = ("REFUNDING", "REFUNDED")


def refund_key(payment_id: str, checkout_id: str | None) -> str:
    """The refund's idempotency key: the saga's own (`(checkout id, "refund")`) when the payment has
    a checkout, so a refund by hand and the saga's refund are one refund at the PSP, never two."""
    if checkout_id:
        return saga_domain.refund_key(checkout_id)
    return saga_domain.step_key(payment_id, "ops-refund")


def _channel(addr: str):
    from cutylib.grpc_client import create_channel
    from cutylib.tls import Transport

    return create_channel(addr, "payments", Transport.from_env("payments"), deadline_seconds=30)


async def retry(addr: str, checkout_id: str, by: str):
    from cuty.payments.v1 import checkout_pb2, checkout_pb2_grpc

    async with _channel(addr) as ch:
        return await checkout_pb2_grpc.CheckoutServiceStub(ch).RetryCheckout(
            checkout_pb2.RetryCheckoutRequest(checkout_id=checkout_id), metadata=((OPERATOR_KEY, by),))


async def refund(addr: str, conn, payment_id: str, by: str, reason: str, force: bool):
    from cuty.payments.v1 import payments_pb2, payments_pb2_grpc

    pid = _uuid_or_none(payment_id)
    row = await conn.fetchrow("SELECT p.id, p.status, p.checkout_id, c.state, c.attention_from FROM payments p "
                              "LEFT JOIN checkouts c ON c.id = p.checkout_id WHERE p.id = $1", pid) if pid else None
    if row is None:
        raise LookupError(f"payment {payment_id} not found")
    checkout_id = _iso(row["checkout_id"])
    state = row["attention_from"] or row["state"]
    if checkout_id and state not in REFUND_WITHOUT_FORCE and not force:
        raise PermissionError(
            f"checkout {checkout_id} is {row['state']}"
            + (f" (from {row['attention_from']})" if row["attention_from"] else "")
            + ": a refund by hand there may refund a confirmed booking or race the saga. "
              "Prefer `ops retry`; use --force if the money must go back anyway.")
    async with _channel(addr) as ch:
        return checkout_id, await payments_pb2_grpc.PaymentServiceStub(ch).RefundPayment(
            payments_pb2.RefundPaymentRequest(payment_id=str(pid), idempotency_key=refund_key(str(pid), checkout_id),
                                              reason=reason),
            metadata=((OPERATOR_KEY, by),))


# -- command line ------------------------------------------------------------------------------------

async def _connect():
    from cutylib.config import database_url_for
    from cutylib.db import ALL_MERCHANTS, create_pool

    # The operator's commands act on any merchant's checkout (each names the one it acts on).
    return await create_pool(database_url_for("payments"), min_size=1, max_size=2,
                             application_name="cuty-payments-ops", merchant=ALL_MERCHANTS)


def _dump(data) -> str:
    return json.dumps(data, indent=2, default=_iso)


async def _run(args) -> int:
    import grpc

    from .operator import clean_name

    pool = await _connect()
    try:
        if args.command == "story":
            found = await story(pool, args.id)
            if args.json:
                print(_dump([s.to_json() for s in found]))
            else:
                print("\n\n".join(render(s) for s in found) if found else
                      f"nothing found for {args.id!r} (tried: checkout id, payment id, PSP intent id, "
                      "payment attempt id, checkout Idempotency-Key)")
            return 0 if found else 1
        if args.command == "stuck":
            rows = await stuck(pool, args.older_than, args.limit)
            print(_dump(rows) if args.json else render_stuck(rows, args.older_than))
            return 0
        by = clean_name(args.by)
        try:
            if args.command == "retry":
                c = await retry(args.addr, args.id, by)
                from cuty.payments.v1 import checkout_pb2
                print(f"checkout {c.id} is {checkout_pb2.CheckoutState.Name(c.state)} again, due now "
                      f"(recorded as retried by ops:{by}); follow it with: python -m payments ops story {c.id}")
                return 0
            from cuty.payments.v1 import payments_pb2
            checkout_id, p = await refund(args.addr, pool, args.id, by, args.reason, args.force)
            print(f"payment {p.id} is {payments_pb2.PaymentStatus.Name(p.status)} (recorded as refund requested "
                  f"by ops:{by})")
            if checkout_id:
                print(f"if checkout {checkout_id} is NEEDS_ATTENTION, `python -m payments ops retry {checkout_id} "
                      f"--by {by}` lets the saga finish (it finds the refund done)")
            return 0
        except grpc.aio.AioRpcError as e:
            print(f"{e.code().name}: {e.details()}", file=sys.stderr)
            return 1
        except (LookupError, PermissionError) as e:
            print(f"refused: {e}", file=sys.stderr)
            return 2
    finally:
        await pool.close()


def main(argv: list[str]) -> int:
    from cutylib.config import grpc_addr_for
    from cutylib.errors import DomainError

    parser = argparse.ArgumentParser(prog="python -m payments ops", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("story", help="everything about one checkout / payment, whichever id you have")
    st.add_argument("id", help="checkout id, payment id, PSP intent id (pi_...), payment attempt id or "
                               "a checkout Idempotency-Key")
    st.add_argument("--json", action="store_true", help="machine-readable")
    sk = sub.add_parser("stuck", help="checkouts in a non-terminal state (NEEDS_ATTENTION included) for too long")
    sk.add_argument("--older-than", type=float, default=DEFAULT_STUCK_SECONDS, metavar="SECONDS",
                    help=f"in their state for longer than this (default {DEFAULT_STUCK_SECONDS:g})")
    sk.add_argument("--limit", type=int, default=200)
    sk.add_argument("--json", action="store_true")
    addr = grpc_addr_for("payments")
    rt = sub.add_parser("retry", help="put a NEEDS_ATTENTION checkout back to the step that kept failing")
    rt.add_argument("id", help="checkout id")
    rt.add_argument("--by", required=True, help="who is doing this (recorded in the timeline)")
    rt.add_argument("--addr", default=addr, help=f"payments gRPC address (default {addr})")
    rf = sub.add_parser("refund", help="refund a captured payment in full (idempotent)")
    rf.add_argument("id", help="payment id")
    rf.add_argument("--by", required=True, help="who is doing this (recorded in the timeline)")
    rf.add_argument("--reason", default="", help="why (recorded in the timeline)")
    rf.add_argument("--force", action="store_true", help="also when the checkout is not refunding "
                                                         "(e.g. a completed booking given back as a goodwill refund)")
    rf.add_argument("--addr", default=addr, help=f"payments gRPC address (default {addr})")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except DomainError as e:
        print(f"{e.code.name}{f' ({e.field})' if e.field else ''}: {e.message}", file=sys.stderr)
        return 2
    except (OSError, asyncpg.PostgresError) as e:
        print(f"cannot reach the payments database: {e}", file=sys.stderr)
        return 1
