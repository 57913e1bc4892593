"""The operator's view as text for a terminal, for someone who did not write the code."""
from __future__ import annotations

from typing import Any

from .queries import TRACE_URL_TEMPLATE, Story

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
