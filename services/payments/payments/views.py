"""What callers are told about a payment: built from a row, and unable to carry a customer action
(redirect URL / client secret) unless the payment is waiting for the customer."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, NamedTuple


from cuty.common.v1 import common_pb2
from cuty.payments.v1 import payments_pb2
from cutylib.timestamps import to_timestamp

from . import domain


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class PaymentView:
    id: str
    checkout_id: str | None
    customer_id: str
    status: str
    version: int
    amount_minor: int
    currency: str
    psp_intent_id: str | None
    payment_method: str
    redirect_url: str | None
    client_secret: str | None
    failure_reason: str | None
    created_at: datetime
    updated_at: datetime
    merchant_id: str = ""  # The merchant paid
    # Refunded or being refunded (pending and succeeded refunds), and what the PSP confirmed.
    refunded_minor: int = 0
    refund_settled_minor: int = 0
    # The payment attempt id: the key it was created with, and the PSP's Idempotency-Key.
    idempotency_key: str = ""
    # 'setup': the PSP saves its card for off-session use (a no-show fee was accepted); 'charge':
    # charged off-session on the card saved for psp_customer (a no-show fee). None: neither.
    off_session: str | None = None
    psp_customer: str | None = None
    # A payment link's: the later off-session charge its hosted page asks the customer's consent
    # to (the booking's no-show fee); the card is saved only if they consent. None: none asked.
    consent_minor: int | None = None

    def __post_init__(self) -> None:
        # Whoever builds a view (a row, a test, the saga), a payment that does not wait for the
        # customer cannot carry the action: docs/architecture.md invariant 6, enforced at the last step too.
        if not domain.shows_customer_action(self.status):
            object.__setattr__(self, "redirect_url", None)
            object.__setattr__(self, "client_secret", None)

    @property
    def terminal(self) -> bool:
        return self.status in domain.TERMINAL

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "PaymentView":
        return cls(
            id=str(row["id"]), checkout_id=_str(row["checkout_id"]), customer_id=row["customer_id"],
            status=row["status"], version=row["version"], amount_minor=row["amount_minor"],
            currency=row["currency"], psp_intent_id=row["psp_intent_id"], payment_method=row["payment_method"],
            redirect_url=row["redirect_url"], client_secret=row["client_secret"],
            failure_reason=row["failure_reason"], created_at=row["created_at"], updated_at=row["updated_at"],
            merchant_id=row["merchant_id"], refunded_minor=row["refunded_minor"],
            refund_settled_minor=row["refund_settled_minor"], idempotency_key=row["idempotency_key"],
            off_session=row.get("off_session"), psp_customer=row.get("psp_customer"),
            consent_minor=row.get("consent_minor"),
        )

    def to_proto(self) -> payments_pb2.Payment:
        p = payments_pb2.Payment(
            id=self.id,
            status=payments_pb2.PaymentStatus.Value(f"PAYMENT_STATUS_{self.status.upper()}"),
            amount=common_pb2.Money(currency_code=self.currency, amount_minor=self.amount_minor),
            psp_intent_id=self.psp_intent_id or "",
            version=self.version,
            checkout_id=self.checkout_id or "",
            payment_method=self.payment_method,
            failure_reason=self.failure_reason or "",
            create_time=to_timestamp(self.created_at),
            update_time=to_timestamp(self.updated_at),
            merchant_id=self.merchant_id,
            refunded=common_pb2.Money(currency_code=self.currency, amount_minor=self.refund_settled_minor),
        )
        if self.redirect_url:
            p.next_action.redirect_url = self.redirect_url
        if self.client_secret:
            p.client_secret = self.client_secret
        return p


class CapturedPayment(NamedTuple):
    """One of a checkout's captured payments, for a refund across them."""
    payment_id: str
    left_minor: int               # what is left of it to refund
    asked_minor: int | None       # what an earlier attempt of this refund asked of it (None: nothing)


@dataclass(frozen=True)
class TimelineEvent:
    seq: int
    payment_id: str | None
    checkout_id: str | None
    source: str
    from_status: str | None
    to_status: str
    version: int | None
    trace_id: str
    note: str
    created_at: datetime

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "TimelineEvent":
        return cls(seq=row["seq"], payment_id=_str(row["payment_id"]), checkout_id=_str(row["checkout_id"]),
                   source=row["source"], from_status=row["from_status"], to_status=row["to_status"],
                   version=row["version"], trace_id=row["trace_id"], note=row["note"], created_at=row["created_at"])

    def to_proto(self) -> payments_pb2.PaymentEvent:
        return payments_pb2.PaymentEvent(
            seq=self.seq, source=self.source, from_status=self.from_status or "", to_status=self.to_status,
            version=self.version or 0, trace_id=self.trace_id, create_time=to_timestamp(self.created_at), note=self.note)


@dataclass(frozen=True)
class RefundView:
    """One refund of a payment: pending until the PSP answers, then succeeded or failed."""
    id: str
    merchant_id: str
    payment_id: str
    key: str
    requested_minor: int | None
    amount_minor: int
    currency: str
    reason: str
    requested_by: str
    status: str
    psp_refund_id: str | None
    failure_reason: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "RefundView":
        return cls(id=str(row["id"]), merchant_id=row["merchant_id"], payment_id=str(row["payment_id"]),
                   key=row["key"], requested_minor=row["requested_minor"], amount_minor=row["amount_minor"],
                   currency=row["currency"], reason=row["reason"], requested_by=row["requested_by"],
                   status=row["status"], psp_refund_id=row["psp_refund_id"], failure_reason=row["failure_reason"],
                   created_at=row["created_at"], updated_at=row["updated_at"])

    def to_proto(self, payment: PaymentView | None = None) -> payments_pb2.Refund:
        out = payments_pb2.Refund(
            id=self.id, payment_id=self.payment_id,
            amount=common_pb2.Money(currency_code=self.currency, amount_minor=self.amount_minor),
            reason=self.reason, requested_by=self.requested_by,
            status=payments_pb2.RefundStatus.Value(f"REFUND_STATUS_{self.status.upper()}"),
            psp_refund_id=self.psp_refund_id or "", failure_reason=self.failure_reason or "",
            create_time=to_timestamp(self.created_at), update_time=to_timestamp(self.updated_at))
        if payment is not None:
            p = payment.to_proto()
            p.ClearField("next_action")
            p.client_secret = ""
            out.payment.CopyFrom(p)
        return out
