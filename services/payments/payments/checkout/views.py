"""What callers are told about a checkout: built from the saga row and the payment as re-read.

The customer action (redirect URL / client secret) appears only while the checkout waits for the
customer (AWAITING_ACTION) and the payment still requires the action (DESIGN.md invariant 6; the
PaymentView already drops it for any other payment status). Code values only reach the owner of a
completed code purchase (the caller decides `codes`)."""
from __future__ import annotations

from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2, payments_pb2

from . import domain
from .domain import Saga

_KIND = {domain.BOOKING: checkout_pb2.BOOKING, domain.CODES: checkout_pb2.CODES}


def _ts(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def to_proto(saga: Saga, payment=None, codes: list[tuple[str, str]] = ()) -> checkout_pb2.Checkout:
    c = checkout_pb2.Checkout(
        id=saga.id,
        kind=_KIND[saga.kind],
        state=checkout_pb2.CheckoutState.Value(saga.state),
        hold_id=saga.hold_id or "",
        order_id=saga.order_id or "",
        expire_time=_ts(saga.expire_time),
        create_time=_ts(saga.created_at),
        slot_id=saga.slot_id or "",
        product_id=saga.product_id or "",
        quantity=saga.quantity,
        failure_reason=saga.failure_reason,
    )
    if saga.amount_minor is not None:
        c.amount.CopyFrom(common_pb2.Money(currency_code=saga.currency or "", amount_minor=saga.amount_minor))
    if payment is not None:
        c.payment.id = payment.id
        c.payment.status = payments_pb2.PaymentStatus.Value(f"PAYMENT_STATUS_{payment.status.upper()}")
        if saga.state == domain.AWAITING_ACTION:
            if payment.redirect_url:
                c.payment.next_action.redirect_url = payment.redirect_url
            if payment.client_secret:
                c.payment.client_secret = payment.client_secret
    for code_id, value in codes:
        c.codes.add(id=code_id, value=value)
    return c
