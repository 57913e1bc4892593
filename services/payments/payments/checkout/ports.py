"""What the checkout saga needs of the payments core, as a typed seam (docs/checkout.md, "The
seam to the payments core"). The saga codes against `Payments` and never reaches into the core
(its pool, its metrics, its SQL); `payments.service.PaymentsCore` is the implementation, handed in
by checkout/wiring.py. The answers are the core's value objects (`PaymentView`, `RefundView`).

Every call that moves money is idempotent on the key it is given (the payment attempt id, a
refund key of (checkout, step)), so a step repeated after a crash asks the same thing again.
"""
from __future__ import annotations

from datetime import datetime
from typing import Protocol

from ..views import CapturedPayment, PaymentView, RefundView

__all__ = ["CapturedPayment", "Payments"]


class Payments(Protocol):
    async def get(self, payment_id: str) -> PaymentView:
        """The payment (NotFound when there is none)."""

    async def find_by_key(self, merchant_id: str, idempotency_key: str) -> PaymentView | None:
        """The payment created with this payment attempt id, if any (a charge whose answer was lost)."""

    async def create_and_charge(self, *, checkout_id: str | None, amount_minor: int, currency: str,
                                payment_method: str, idempotency_key: str, customer_id: str,
                                merchant_id: str, off_session: str | None = None,
                                psp_customer: str | None = None, consent_minor: int | None = None) -> PaymentView:
        """Create the payment once per key and charge it; a PSP timeout leaves it non-terminal.
        `off_session` 'setup' saves the card for one later charge, 'charge' is that charge;
        `consent_minor`: a payment link's page asks the customer's consent to that charge first."""

    async def consent_accepted_at(self, payment_id: str) -> datetime | None:
        """When the customer consented on a link's hosted page to the charge it asked about, else None."""

    async def saved_card(self, payment_id: str) -> tuple[str, str] | None:
        """(PSP customer, saved payment method) of a captured purchase that saved its card, else None."""

    async def cancel(self, payment_id: str) -> PaymentView:
        """Cancel at the PSP; a payment that succeeded meanwhile is answered as succeeded."""

    async def refund(self, payment_id: str, idempotency_key: str, *, note: str = ...,
                     actor: str = ...) -> PaymentView:
        """Refund what is left of a captured payment (-> refunded)."""

    async def issue_refund(self, merchant_id: str, payment_id: str, idempotency_key: str, *,
                           amount_minor: int | None, currency: str | None, reason: str, actor: str,
                           codes_delivered_ok: bool, note: str | None = None) -> RefundView:
        """Refund `amount_minor` of a captured payment (one refund row, never past what was captured)."""

    async def captured_payments(self, checkout_id: str, purchase_payment_id: str | None, purchase_key: str,
                                other_key_prefix: str) -> list[CapturedPayment]:
        """The checkout's captured payments, the purchase's first, then by time; `asked_minor` is what
        the refund on `purchase_key` (others: `other_key_prefix` + the payment id) asked before."""
