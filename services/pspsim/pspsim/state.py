"""In-memory objects and the ledger: payment intents, refunds, idempotency records, faults.

Everything runs on one event loop, and no method here awaits, so each method is atomic.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cutylib import digests

# Intent statuses.
REQUIRES_ACTION = "requires_action"
PROCESSING = "processing"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELED = "canceled"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELED})


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def fingerprint(params: dict[str, Any]) -> str:
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass
class Intent:
    id: str
    amount: int
    currency: str
    payment_method: str
    metadata: dict[str, Any]
    idempotency_key: str
    status: str
    client_secret: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    next_action: dict[str, Any] | None = None
    last_payment_error: dict[str, Any] | None = None
    amount_refunded: int = 0
    canceled_at: int | None = None
    cancellation_reason: str | None = None
    # The W3C traceparent the create request came with: its webhooks carry it back.
    traceparent: str | None = None
    # Created without a payment method: the customer presents one on the hosted page (a payment link).
    hosted: bool = False
    # setup_future_usage "off_session": once it succeeds, its card is saved for `customer` as
    # `saved_payment_method`. An off-session charge: made with a saved method, without the customer.
    setup_future_usage: str | None = None
    customer: str | None = None
    saved_payment_method: str | None = None
    off_session: bool = False
    # A hosted page that asks the customer to consent to one later off-session charge of at most
    # `amount` (a merchant's no-show fee): {"amount", "currency", "accepted", "accepted_at"}. Only
    # an accepted consent saves the card (setup_future_usage is set when the customer accepts).
    off_session_consent: dict[str, Any] | None = None

    def snapshot(self, **override: Any) -> dict[str, Any]:
        out = {
            "id": self.id,
            "object": "payment_intent",
            "status": self.status,
            "amount": self.amount,
            "amount_refunded": self.amount_refunded,
            "currency": self.currency,
            "payment_method": self.payment_method or None,
            "client_secret": self.client_secret,
            "next_action": self.next_action,
            "last_payment_error": self.last_payment_error,
            "metadata": self.metadata,
            "created": self.created,
            "canceled_at": self.canceled_at,
            "cancellation_reason": self.cancellation_reason,
            "setup_future_usage": self.setup_future_usage,
            "customer": self.customer,
            "saved_payment_method": self.saved_payment_method,
            "off_session": self.off_session,
            "off_session_consent": self.off_session_consent,
        }
        out.update(override)
        return copy.deepcopy(out)


@dataclass
class Refund:
    id: str
    payment_intent: str
    amount: int
    currency: str
    idempotency_key: str
    metadata: dict[str, Any]
    reason: str | None = None
    status: str = SUCCEEDED
    created: int = field(default_factory=lambda: int(time.time()))

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(
            {
                "id": self.id,
                "object": "refund",
                "payment_intent": self.payment_intent,
                "amount": self.amount,
                "currency": self.currency,
                "status": self.status,
                "reason": self.reason,
                "metadata": self.metadata,
                "created": self.created,
            }
        )


def charge_fact(intent: Intent) -> int:
    """The balance report's fingerprint of a captured charge (cutylib.digests): its intent, what it
    captured and what was refunded of it. Kept with the charge and renewed at each refund, as a
    real PSP keeps its balances, so that a report costs a sum, not a hash, per charge."""
    return digests.fingerprint_of(intent.id, intent.amount, intent.amount_refunded)


@dataclass(frozen=True)
class SavedMethod:
    """A card saved for off-session charges: whose it is and which test card it was."""
    id: str
    customer: str
    card: str


@dataclass
class IdempotencyRecord:
    fingerprint: str
    object_id: str


class Store:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.intents: dict[str, Intent] = {}
        self.refunds: dict[str, Refund] = {}
        # Keys are scoped per operation ("create", "refund").
        self.idempotency: dict[tuple[str, str], IdempotencyRecord] = {}
        # Captures in time order, with their times and positions (the list API pages by them).
        self.charges: list[dict[str, Any]] = []
        self.charge_times: list[float] = []
        self.charge_index: dict[str, int] = {}
        self.refund_order: list[str] = []
        self.refund_times: list[float] = []
        self.refund_index: dict[str, int] = {}
        self.charge_count_by_key: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.saved_methods: dict[str, SavedMethod] = {}

    # -- idempotency ---------------------------------------------------------------------
    def lookup_key(self, scope: str, key: str) -> IdempotencyRecord | None:
        return self.idempotency.get((scope, key))

    def remember_key(self, scope: str, key: str, fp: str, object_id: str) -> None:
        self.idempotency[(scope, key)] = IdempotencyRecord(fp, object_id)

    # -- faults --------------------------------------------------------------------------
    def take_fault(self, operation: str) -> bool:
        """Consume one injected failure for ``operation`` if any is pending."""
        if self.faults[operation] > 0:
            self.faults[operation] -= 1
            return True
        return False

    # -- money ---------------------------------------------------------------------------
    def capture(self, intent: Intent) -> bool:
        """Move a non-terminal intent to succeeded and record the charge (exactly once)."""
        if intent.status in TERMINAL:
            return False
        intent.status = SUCCEEDED
        intent.next_action = None
        intent.last_payment_error = None
        if intent.setup_future_usage and intent.payment_method and intent.saved_payment_method is None:
            saved = SavedMethod(new_id("pm_saved"), intent.customer or new_id("cus"), intent.payment_method)
            self.saved_methods[saved.id] = saved
            intent.customer, intent.saved_payment_method = saved.customer, saved.id
        # Never before the last capture: the list API's windows bisect these times.
        at = max(time.time(), self.charge_times[-1] if self.charge_times else 0.0)
        charge_id = "ch_" + intent.id.split("_", 1)[-1]
        self.charge_index[charge_id] = len(self.charges)
        self.charges.append({"id": charge_id, "intent_id": intent.id, "idempotency_key": intent.idempotency_key,
                             "at": at, "key": digests.key_hash(intent.id), "fact": charge_fact(intent),
                             "currency": intent.currency, "amount": intent.amount, "refunded": intent.amount_refunded})
        self.charge_times.append(at)
        self.charge_count_by_key[intent.idempotency_key] += 1
        return True

    def add_refund(self, intent: Intent, refund: Refund) -> None:
        intent.amount_refunded += refund.amount
        at = self.charge_index.get("ch_" + intent.id.split("_", 1)[-1])
        if at is not None:  # the balance report's fact of the charge moves with what was refunded
            self.charges[at].update(fact=charge_fact(intent), refunded=intent.amount_refunded)
        self.refunds[refund.id] = refund
        self.refund_index[refund.id] = len(self.refund_order)
        self.refund_order.append(refund.id)
        self.refund_times.append(max(time.time(), self.refund_times[-1] if self.refund_times else 0.0))

    def ledger(self) -> dict[str, Any]:
        charges = []
        for c in self.charges:
            intent = self.intents[c["intent_id"]]
            charges.append(
                {
                    "idempotency_key": c["idempotency_key"],
                    "intent_id": intent.id,
                    "amount": intent.amount,
                    "amount_refunded": intent.amount_refunded,
                    "currency": intent.currency,
                    "payment_method": intent.payment_method,
                    "off_session": intent.off_session,
                    "status": SUCCEEDED,
                    "captured_at": c["at"],
                }
            )
        refunds = [
            {
                "idempotency_key": r.idempotency_key,
                "refund_id": r.id,
                "intent_id": r.payment_intent,
                "amount": r.amount,
                "currency": r.currency,
                "status": r.status,
            }
            for r in self.refunds.values()
        ]
        totals: dict[str, dict[str, int]] = {}
        for c in charges:
            totals.setdefault(c["currency"], {"charged": 0, "refunded": 0})["charged"] += c["amount"]
        for r in refunds:
            totals.setdefault(r["currency"], {"charged": 0, "refunded": 0})["refunded"] += r["amount"]
        return {
            "charges": charges,
            "refunds": refunds,
            "charge_count_by_key": dict(self.charge_count_by_key),
            "totals_by_currency": totals,
        }
