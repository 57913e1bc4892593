"""Payment rules with no I/O: the forward-only state machine and what a PSP object means for us.

The synchronous PSP answer, the webhook and reconciliation all feed `decide()`; whatever order they
arrive in, a payment only moves forward (docs/payments.md, "Finalize"; the schema repeats the
transition table as a trigger so the database refuses a regression even from a buggy caller).
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

from cutylib.errors import InvalidArgument

CREATED = "created"
REQUIRES_ACTION = "requires_action"
PROCESSING = "processing"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELED = "canceled"
# Part of the captured amount went back to the buyer (payments.refund_settled_minor), the
# rest is still captured; a further refund may follow. Never set by a PSP observation: only by
# the refund path (repository.SETTLE_REFUND), from the running totals.
PARTIALLY_REFUNDED = "partially_refunded"
REFUNDED = "refunded"

STATUSES = (CREATED, REQUIRES_ACTION, PROCESSING, SUCCEEDED, FAILED, CANCELED, PARTIALLY_REFUNDED, REFUNDED)
# No client secret or redirect URL is ever shown for these (docs/architecture.md, invariant 6).
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELED, PARTIALLY_REFUNDED, REFUNDED})
# What a refund may start from: the captured payment, whole or partly refunded.
REFUNDABLE = frozenset({SUCCEEDED, PARTIALLY_REFUNDED})
# Reconciliation asks the PSP about payments stuck in one of these.
NON_TERMINAL = (CREATED, REQUIRES_ACTION, PROCESSING)
SOURCES = ("sync", "webhook", "reconcile", "saga")

TRANSITIONS: dict[str, frozenset[str]] = {
    CREATED: frozenset({REQUIRES_ACTION, PROCESSING, SUCCEEDED, FAILED, CANCELED}),
    REQUIRES_ACTION: frozenset({PROCESSING, SUCCEEDED, FAILED, CANCELED}),
    PROCESSING: frozenset({SUCCEEDED, FAILED, CANCELED}),
    SUCCEEDED: frozenset({PARTIALLY_REFUNDED, REFUNDED}),
    FAILED: frozenset(),
    CANCELED: frozenset(),
    PARTIALLY_REFUNDED: frozenset({REFUNDED}),
    REFUNDED: frozenset(),
}

# How far along the lifecycle a status is. An observation of a lower rank than the current status
# is old news (a late `processing` after `succeeded`); the same rank but another status, or a higher
# rank the table does not allow, contradicts what we know.
_RANK = {CREATED: 0, REQUIRES_ACTION: 1, PROCESSING: 2, SUCCEEDED: 3, FAILED: 3, CANCELED: 3, PARTIALLY_REFUNDED: 4,
         REFUNDED: 5}


class Outcome(enum.Enum):
    APPLY = "apply"              # a forward transition: write it
    SAME = "same"                # already there: nothing to write
    STALE = "stale"              # an older state than ours: ignore (and log)
    CONTRADICTS = "contradicts"  # disagrees with what we know: ask the PSP, never guess from order


def can_transition(current: str, new: str) -> bool:
    return new in TRANSITIONS[current]


def decide(current: str, observed: str) -> Outcome:
    if current not in _RANK:
        raise ValueError(f"unknown current status {current!r}; expected one of {', '.join(STATUSES)}")
    if observed not in _RANK or observed == CREATED:
        raise ValueError(f"unknown observed status {observed!r}; the PSP reports one of {', '.join(STATUSES[1:])}")
    if observed == current:
        return Outcome.SAME
    if can_transition(current, observed):
        return Outcome.APPLY
    if _RANK[observed] < _RANK[current]:
        return Outcome.STALE
    return Outcome.CONTRADICTS


@functools.cache
def old_news(observed: str) -> tuple[str, ...]:
    """The payment statuses to which an observation of `observed` adds nothing (`decide` answers
    SAME or STALE), e.g. `processing` once the payment succeeded: a webhook reporting it (about the
    payment's own intent) is acknowledged without a lease, a read or a write (webhooks.py)."""
    return tuple(s for s in STATUSES if decide(s, observed) in (Outcome.SAME, Outcome.STALE))


def shows_customer_action(status: str) -> bool:
    """Only a payment waiting for the customer (3-D Secure) may expose redirect URL / client secret."""
    return status == REQUIRES_ACTION


# -- what PSP objects mean -------------------------------------------------------------------------

_INTENT_STATUS = {
    "requires_action": REQUIRES_ACTION,
    "processing": PROCESSING,
    "succeeded": SUCCEEDED,
    "failed": FAILED,
    "canceled": CANCELED,
}

EVENT_STATUS = {
    "payment_intent.requires_action": REQUIRES_ACTION,
    "payment_intent.processing": PROCESSING,
    "payment_intent.succeeded": SUCCEEDED,
    "payment_intent.payment_failed": FAILED,
    "payment_intent.canceled": CANCELED,
    "charge.refunded": REFUNDED,
}


def status_of_intent(intent: dict[str, Any]) -> str:
    raw = intent.get("status")
    if raw not in _INTENT_STATUS:
        raise ValueError(f"PSP intent status must be one of {', '.join(_INTENT_STATUS)}, got {raw!r}")
    amount, refunded = intent.get("amount") or 0, intent.get("amount_refunded") or 0
    if raw == "succeeded" and amount > 0 and refunded >= amount:
        return REFUNDED  # a fully refunded intent stays "succeeded" at the PSP
    return _INTENT_STATUS[raw]


@dataclass(frozen=True)
class Observation:
    """What one PSP object tells us, reduced to the columns finalize may write."""
    psp_intent_id: str | None = None
    redirect_url: str | None = None
    client_secret: str | None = None
    failure_reason: str | None = None
    psp_refund_id: str | None = None


def observation_of(obj: dict[str, Any] | None) -> Observation:
    """Read an intent (or a refund) from the PSP; missing parts stay None so they never overwrite."""
    if not obj:
        return Observation()
    if obj.get("object") == "refund":
        return Observation(psp_intent_id=obj.get("payment_intent") or None, psp_refund_id=obj.get("id") or None)
    next_action = obj.get("next_action") or {}
    error = obj.get("last_payment_error") or {}
    reason = error.get("code") or error.get("message") or None
    return Observation(
        psp_intent_id=obj.get("id") or None,
        redirect_url=next_action.get("redirect_url") or None,
        client_secret=obj.get("client_secret") or None,
        failure_reason=reason,
    )


def intent_body(*, payment_id: str, checkout_id: str | None, amount_minor: int, currency: str,
                payment_method: str, off_session: str | None = None, psp_customer: str | None = None,
                consent_minor: int | None = None) -> dict[str, Any]:
    """The PSP create body, built only from our own row so a replay with the same Idempotency-Key
    (reconciliation after a timeout) is byte-for-byte the same request and never a 422."""
    metadata = {"payment_id": payment_id}
    if checkout_id:
        metadata["checkout_id"] = checkout_id
    if payment_method == HOSTED_PAGE:
        # A payment link: no card yet; the customer presents one on the PSP's hosted page, which
        # also asks their consent to the booking's no-show fee when the link offers one.
        body = {"amount": amount_minor, "currency": currency, "payment_method_collection": HOSTED_PAGE,
                "metadata": metadata}
        if consent_minor is not None:
            body["off_session_consent"] = {"amount": consent_minor}
        return body
    body = {"amount": amount_minor, "currency": currency, "payment_method": payment_method, "metadata": metadata}
    if off_session == OFF_SESSION_SETUP:
        body["setup_future_usage"] = "off_session"  # the customer accepted a later off-session charge
    elif off_session == OFF_SESSION_CHARGE:
        body.update(off_session=True, customer=psp_customer)
    return body


# A payment's off-session role (payments.off_session): a purchase whose card the PSP saves for one
# later charge without the customer, and that charge (a no-show fee the customer accepted).
OFF_SESSION_SETUP, OFF_SESSION_CHARGE = "setup", "charge"


# The payment method of a payment whose card the customer presents on the PSP's hosted page (a
# staff-made checkout's payment link): the intent waits in requires_action, its redirect URL the page.
HOSTED_PAGE = "hosted_page"


# -- request validation ------------------------------------------------------------------------------

MAX_PAYMENT_METHOD = 64


def require_payment_method(value: str) -> str:
    """A payment method as every request takes it (PayCheckout, a one-call
    CreateCheckout, a reschedule's price increase): 1..64 printable characters, passed to the PSP as is."""
    if not value or len(value) > MAX_PAYMENT_METHOD or not value.isprintable():
        raise InvalidArgument("payment_method", f"payment_method must be 1..{MAX_PAYMENT_METHOD} printable "
                                                f"characters, got {value!r}")
    return value
