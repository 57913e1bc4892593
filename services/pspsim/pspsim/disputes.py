"""Disputes (chargebacks), Stripe-like: a captured charge is disputed by the cardholder's bank; the
merchant has until `evidence_due_by` to submit evidence; the bank then decides.

- opened by the admin route `POST /v1/_disputes {payment_intent, amount?, reason?, due_in_seconds?,
  outcome?}` or, for intents of the scenario `pm_card_disputed`, by itself shortly after the capture
  (`CUTY_PSP_DISPUTE_DELAY_MS`); sends `charge.dispute.created`;
- `POST /v1/disputes/{id} {evidence: {...}, submit: true}` (the platform): the evidence is kept and
  the dispute goes `under_review`; the bank decides after `CUTY_PSP_DISPUTE_DECIDE_MS`: `won` when
  evidence was submitted (unless the opening asked for `outcome: "lost"`), sending
  `charge.dispute.closed`;
- the deadline passing without evidence closes it `lost`; `POST /v1/_disputes/{id}/close {status}`
  closes it at once (tests). A lost dispute takes its amount back from the merchant: the ledger's
  `disputes` list and each charge's `amount_disputed_lost` say what the PSP kept in the end.
Every event is signed and retried like the other webhooks.
"""
from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .scenarios import scenario_of
from .state import SUCCEEDED, new_id
from .validation import ApiError, check_fields, invalid

log = logging.getLogger("pspsim.disputes")

NEEDS_RESPONSE, UNDER_REVIEW, WON, LOST = "needs_response", "under_review", "won", "lost"
CLOSED = frozenset({WON, LOST})
REASONS = ("fraudulent", "product_not_received", "duplicate", "general")
MAX_EVIDENCE_BYTES = 60 * 1024  # within the API's 64 KB body


@dataclass
class Dispute:
    id: str
    payment_intent: str
    amount: int
    currency: str
    reason: str
    evidence_due_by: int
    outcome: str  # what the bank will decide on evidence: "won" (the default) or "lost"
    status: str = NEEDS_RESPONSE
    evidence: dict[str, Any] | None = None
    evidence_submitted_at: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    closed_at: int | None = None
    # When it last changed (opened, answered, closed): the list API's `updated[gte]`.
    updated: float = field(default_factory=time.time)

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy({
            "id": self.id, "object": "dispute", "payment_intent": self.payment_intent, "amount": self.amount,
            "currency": self.currency, "reason": self.reason, "status": self.status,
            "evidence_details": {"due_by": self.evidence_due_by, "submitted_at": self.evidence_submitted_at,
                                 "has_evidence": self.evidence is not None},
            "evidence": self.evidence, "created": self.created, "closed_at": self.closed_at})


class Disputes:
    """`psp`: the Psp (its store of intents, its webhooks, its timers)."""

    def __init__(self, psp):
        self.psp = psp
        self.items: dict[str, Dispute] = {}

    def reset(self) -> None:
        self.items.clear()

    def _get(self, dispute_id: str) -> Dispute:
        d = self.items.get(dispute_id)
        if d is None:
            raise ApiError(404, "invalid_request_error", "resource_missing", f"no such dispute: {dispute_id!r}",
                           param="id")
        return d

    def _emit(self, d: Dispute, type_: str) -> None:
        d.updated = time.time()
        intent = self.psp.store.intents[d.payment_intent]
        if not scenario_of(intent.payment_method).dispute_webhooks:
            log.info("dispute webhook dropped (scenario)", extra={"dispute_id": d.id, "type": type_})
            return
        event = self.psp._event(intent, type_, d.snapshot())
        if event is not None:
            self.psp._emit(intent, event)

    def _later(self, seconds: float, fn, *args) -> None:
        async def run():
            await asyncio.sleep(max(0.0, seconds))
            fn(*args)
        task = asyncio.get_running_loop().create_task(run())
        self.psp._timers.add(task)
        task.add_done_callback(self.psp._timers.discard)

    # -- the bank's side (admin routes, the scenario) ----------------------------------------
    def open(self, body: dict[str, Any]) -> dict[str, Any]:
        check_fields(body, {"payment_intent", "amount", "reason", "due_in_seconds", "outcome"})
        intent = self.psp.store.intents.get(body.get("payment_intent"))
        if intent is None:
            raise ApiError(404, "invalid_request_error", "resource_missing",
                           f"no such payment_intent: {body.get('payment_intent')!r}", param="payment_intent")
        if intent.status != SUCCEEDED:
            raise ApiError(400, "invalid_request_error", "payment_intent_unexpected_state",
                           f"only a captured charge is disputed; its status is {intent.status}",
                           param="payment_intent")
        amount = body.get("amount", intent.amount)
        if isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount <= intent.amount:
            raise invalid("parameter_invalid_integer", f"amount must be 1..{intent.amount}, got {amount!r}", "amount")
        reason = body.get("reason", "product_not_received")
        if reason not in REASONS:
            raise invalid("parameter_invalid", f"reason must be one of {', '.join(REASONS)}", "reason")
        due_in = body.get("due_in_seconds", self.psp.settings.dispute_due_seconds)
        if isinstance(due_in, bool) or not isinstance(due_in, (int, float)) or not 0 < due_in <= 60 * 86400:
            raise invalid("parameter_invalid", "due_in_seconds must be 0 < x <= 5184000", "due_in_seconds")
        outcome = body.get("outcome", WON)
        if outcome not in (WON, LOST):
            raise invalid("parameter_invalid", "outcome must be won or lost (decided on the evidence)", "outcome")
        d = Dispute(id=new_id("dp"), payment_intent=intent.id, amount=amount, currency=intent.currency,
                    reason=reason, evidence_due_by=int(time.time() + due_in), outcome=outcome)
        self.items[d.id] = d
        log.info("dispute opened", extra={"dispute_id": d.id, "intent_id": intent.id, "amount": amount})
        self._emit(d, "charge.dispute.created")
        self._later(due_in, self._deadline, d)
        return d.snapshot()

    def open_after_capture(self, intent) -> None:
        """The scenario pm_card_disputed: the bank disputes the charge shortly after it was captured."""
        self._later(self.psp.settings.dispute_delay_ms / 1000.0, lambda: self.open({"payment_intent": intent.id}))

    def close(self, dispute_id: str, body: dict[str, Any]) -> dict[str, Any]:
        check_fields(body, {"status"})
        status = body.get("status")
        if status not in CLOSED:
            raise invalid("parameter_invalid", "status must be won or lost", "status")
        d = self._get(dispute_id)
        self._close(d, status)
        return d.snapshot()

    def _close(self, d: Dispute, status: str) -> None:
        if d.status in CLOSED:
            return
        d.status, d.closed_at = status, int(time.time())
        log.info("dispute closed", extra={"dispute_id": d.id, "status": status})
        self._emit(d, "charge.dispute.closed")

    def _deadline(self, d: Dispute) -> None:
        if d.status == NEEDS_RESPONSE:  # no evidence in time: lost
            self._close(d, LOST)

    def _decide(self, d: Dispute) -> None:
        self._close(d, d.outcome)

    # -- the merchant's side -----------------------------------------------------------------
    def get(self, dispute_id: str) -> dict[str, Any]:
        return self._get(dispute_id).snapshot()

    def submit(self, dispute_id: str, body: dict[str, Any]) -> dict[str, Any]:
        check_fields(body, {"evidence", "submit"})
        evidence = body.get("evidence")
        if not isinstance(evidence, dict) or not evidence:
            raise invalid("parameter_invalid", "evidence must be a non-empty object", "evidence")
        if len(json.dumps(evidence)) > MAX_EVIDENCE_BYTES:
            raise invalid("parameter_invalid", f"evidence must be at most {MAX_EVIDENCE_BYTES} bytes", "evidence")
        d = self._get(dispute_id)
        if d.status != NEEDS_RESPONSE:
            if d.evidence == evidence:
                return d.snapshot()  # the same submission again (a retry)
            raise ApiError(400, "invalid_request_error", "dispute_not_open",
                           f"the dispute is {d.status}: evidence is no longer accepted", param="id")
        if time.time() > d.evidence_due_by:
            raise ApiError(400, "invalid_request_error", "evidence_too_late", "the evidence is due no more", param="id")
        d.evidence = copy.deepcopy(evidence)
        d.evidence_submitted_at = int(time.time())
        if body.get("submit", True):
            d.status = UNDER_REVIEW
            d.updated = time.time()
            self._later(self.psp.settings.dispute_decide_ms / 1000.0, self._decide, d)
        return d.snapshot()

    def lost_by_intent(self) -> dict[str, int]:
        """What lost disputes took back, per intent."""
        lost: dict[str, int] = {}
        for d in self.items.values():
            if d.status == LOST:
                lost[d.payment_intent] = lost.get(d.payment_intent, 0) + d.amount
        return lost

    def ledger(self) -> list[dict[str, Any]]:
        return [{"dispute_id": d.id, "intent_id": d.payment_intent, "amount": d.amount, "currency": d.currency,
                 "status": d.status, "evidence_submitted": d.evidence is not None} for d in self.items.values()]
