"""The payments core's refunds: the saga's full refund of a payment (`refund`), a refund of an amount
(`issue_refund`: staff's, a cancel after purchase, a cheaper reschedule), their completion at the
PSP and the reconciliation of refunds left pending. docs/payments.md, "Refunds", is the
specification: the running total never passes what was captured (RESERVE_REFUND decides in one
statement, whoever races), and a refund's Idempotency-Key at the PSP is the refund's id.

`PaymentsCore` (service.py) is built from this class; these methods use the core's pool, PSP
client, metrics and its payment reads and `finalize`.
"""
from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import asyncpg

from cutylib import crash, tenancy
from cutylib.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable, require
from cutylib.fields import parse_uuid
from cutylib.principal import Principal
from cutylib.telemetry import current_trace_id

from . import domain, metrics as m, repository as sql
from .psp import PspError, PspUnavailable
from .views import PaymentView, RefundView

if TYPE_CHECKING:
    from cutylib.psp import Psp

log = logging.getLogger(__name__)

# A refund's Idempotency-Key, as stored (refunds.key).
MAX_REFUND_KEY = 255


class RefundCases:
    """The refund use cases of `PaymentsCore`."""

    pool: asyncpg.Pool
    rows: sql.Payments
    refund_rows: sql.Refunds
    psp: "Psp"
    metrics: m.PaymentsMetrics

    if TYPE_CHECKING:  # the core's, service.py
        async def get(self, payment_id: str, *, seen_by: Principal | None = None) -> PaymentView: ...

        async def finalize(self, payment_id: str, observed_status: str, source: str, *,
                           intent: dict[str, Any] | None = None, note: str = "") -> PaymentView: ...

        async def ask_psp(self, view: PaymentView) -> dict[str, Any]: ...

    async def refund(self, payment_id: str, idempotency_key: str, *, note: str = "refund requested",
                     actor: str = "system") -> PaymentView:
        """The saga's (and ops') full refund of a succeeded payment, idempotent on `idempotency_key`
        -> refunded. It refunds only what the merchant's own refunds left (one more refund
        row, "the rest"); when they refunded everything already there is nothing to do."""
        require(bool(idempotency_key), "idempotency_key", "idempotency_key must not be empty")
        view = await self.get(payment_id)
        if view.status == domain.REFUNDED:
            return view
        try:
            if view.status in domain.NON_TERMINAL or not view.psp_intent_id:
                intent = await self.ask_psp(view)  # a lost webhook must not block the refund
                view = await self.finalize(view.id, domain.status_of_intent(intent), "sync", intent=intent)
        except PspError as exc:
            raise FailedPrecondition(f"the PSP refused to tell payment {view.id}'s status: {exc.code}",
                                     reason="psp-refused") from exc
        except PspUnavailable as exc:
            raise Unavailable(f"PSP unavailable while refunding payment {view.id}; retry") from exc
        if view.status == domain.REFUNDED:
            return view
        if view.status not in domain.REFUNDABLE:
            raise FailedPrecondition(f"only a succeeded payment can be refunded; payment {view.id} is "
                                     f"{view.status}", reason="payment-not-refundable")
        # Refunds of others left pending (a PSP timeout, a crash) are finished first: the rest is
        # what they do not cover.
        for pending in await self.refund_rows.pending_of(uuid.UUID(view.id)):
            if pending.key != idempotency_key:
                await self._complete(pending)
        view = await self.get(view.id)
        if view.status == domain.REFUNDED:
            return view
        # A refund the PSP refused refunded nothing; the saga's retry (an operator's, after fixing the
        # cause) asks again as a new refund: the key with an attempt number.
        key, attempt = idempotency_key, 0
        while (existing := await self.refund_rows.by_key(view.merchant_id, uuid.UUID(view.id),
                                                         key)) is not None and existing.status == "failed":
            attempt += 1
            key = f"{idempotency_key}#{attempt}"
        if existing is None and view.refunded_minor >= view.amount_minor:
            # Everything is refunded or being refunded by refunds still pending at the PSP.
            raise Unavailable(f"refunds of payment {view.id} are still pending at the PSP; retry")
        await self.issue_refund(view.merchant_id, view.id, key, amount_minor=None, currency=None,
                                reason=note, actor=actor, codes_delivered_ok=True, note=note)
        return await self.get(view.id)

    async def issue_refund(self, merchant_id: str, payment_id: str, idempotency_key: str, *,
                           amount_minor: int | None, currency: str | None, reason: str, actor: str,
                           codes_delivered_ok: bool, note: str | None = None,
                           seen_by: Principal | None = None) -> RefundView:
        """Refund `amount_minor` (None: the rest of what was captured) of a captured payment
        of `merchant_id`. Idempotent on (merchant, payment, key): the same key and body answer the same
        refund (finishing it at the PSP if it was left pending); another body is refused. The running
        total never passes the captured amount: RESERVE_REFUND decides, whoever races."""
        pid = parse_uuid("payment_id", payment_id)
        require(bool(idempotency_key) and len(idempotency_key) <= MAX_REFUND_KEY, "idempotency_key",
                f"idempotency_key must be 1..{MAX_REFUND_KEY} characters (the Idempotency-Key header)")
        refund_id = uuid.uuid4()
        try:
            # A staff or admin user's write runs confined to their merchant (RLS, the second line
            # behind `merchant_id = $2`).
            async with tenancy.scoped(self.pool, seen_by) as uow:
                refund = await sql.Refunds(uow.conn).reserve(
                    refund_id, merchant_id, pid, idempotency_key, amount_minor, reason, actor, codes_delivered_ok,
                    current_trace_id(), note or f"refund requested by {actor}: {reason}", currency)
                await uow.commit()
        except asyncpg.UniqueViolationError:
            refund = None
        if refund is None:
            # Nothing written: the key was used before (a replay, answered as the first time), or
            # the refund does not fit (asked again, a replay's "rest" is 0 once its refund counts).
            first = await self.refund_rows.by_key(merchant_id, pid, idempotency_key, seen_by)
            if first is not None:
                return await self._replay(first, idempotency_key, amount_minor, currency, reason)
            raise await self._refusal(merchant_id, pid, amount_minor, currency)
        m.count_refund(self.metrics, "reserved")
        return await self._complete(refund)

    async def _replay(self, refund: RefundView, key: str, amount_minor: int | None, currency: str | None,
                      reason: str) -> RefundView:
        if (refund.requested_minor, refund.reason) != (amount_minor, reason) or (
                currency is not None and currency != refund.currency):
            raise FailedPrecondition(f"idempotency key {key!r} was used for another refund of payment "
                                     f"{refund.payment_id}", reason="idempotency-key-reused")
        m.count_refund(self.metrics, "replayed")
        if refund.status == "failed":
            raise FailedPrecondition(f"the PSP refused refund {refund.id}: {refund.failure_reason}",
                                     reason="psp-refused")
        return await self._complete(refund) if refund.status == "pending" else refund

    async def _refusal(self, merchant_id: str, pid: uuid.UUID, amount_minor: int | None,
                       currency: str | None) -> Exception:
        """Why RESERVE_REFUND wrote nothing, as the error to raise."""
        row = await self.refund_rows.refusal(pid, merchant_id)
        if row is None:
            return NotFound(f"payment {pid} not found")
        if currency is not None and currency != row["currency"]:
            return InvalidArgument("amount.currency_code", f"the payment is in {row['currency']}, got {currency}")
        if row["status"] not in domain.REFUNDABLE:
            return FailedPrecondition(f"only a succeeded payment can be refunded; payment {pid} is {row['status']}",
                                      reason="payment-not-refundable")
        if row["codes_delivered"]:
            return FailedPrecondition(f"payment {pid} bought codes that were delivered to the buyer; only the "
                                      f"merchant's admin may refund it, with an explicit amount",
                                      reason="codes-delivered")
        left = row["amount_minor"] - row["refunded_minor"]
        if amount_minor is None:
            return FailedPrecondition(f"payment {pid} has nothing left to refund ({row['refunded_minor']} of "
                                      f"{row['amount_minor']} {row['currency']} refunded or pending)",
                                      reason="nothing-to-refund")
        return FailedPrecondition(f"a refund of {amount_minor} exceeds what is left of payment {pid}: {left} "
                                  f"{row['currency']} minor units", reason="refund-exceeds-captured")

    async def _complete(self, refund: RefundView, *, source: str = "sync") -> RefundView:
        """Ask the PSP for a pending refund (its Idempotency-Key is the refund's id, so asking again
        never refunds twice) and record the answer. A PSP timeout leaves it pending: Unavailable."""
        crash.point("psp_refund:before")
        payment = await self.rows.get(uuid.UUID(refund.payment_id))
        try:
            answer = await self.psp.create_refund(refund.id, payment.psp_intent_id,
                                                  {"payment_id": refund.payment_id, "refund_id": refund.id},
                                                  amount=refund.amount_minor)
        except PspUnavailable as exc:
            m.count_refund(self.metrics, "pending")
            raise Unavailable(f"PSP unavailable while refunding payment {refund.payment_id}; the refund "
                              f"{refund.id} is pending: retry with the same Idempotency-Key") from exc
        except PspError as exc:
            await self.refund_rows.fail(uuid.UUID(refund.id), exc.code or f"http_{exc.status}", current_trace_id())
            m.count_refund(self.metrics, "failed")
            raise FailedPrecondition(f"the PSP refused refund {refund.id} of payment {refund.payment_id}: "
                                     f"{exc.code}", reason="psp-refused") from exc
        crash.point("psp_refund:after")
        settled = await self.refund_rows.settle(uuid.UUID(refund.id), str(answer.get("id") or ""),
                                                current_trace_id(), source)
        if settled is None:  # settled meanwhile by another retry (or reconciliation): the same answer
            settled = await self.refund_rows.get(uuid.UUID(refund.id))
        else:
            m.count_refund(self.metrics, "succeeded")
        return settled

    async def finish_pending_refunds(self, older_than_seconds: float, limit: int = 20) -> int:
        """Reconciliation of refunds left pending (PSP timeouts, crashes): claim a batch (SKIP LOCKED;
        the claim moves the refund's updated_at, so replicas do not ask twice at once) and ask the PSP
        again with the same key. Returns how many were claimed."""
        claimed = await self.refund_rows.claim_pending(limit, older_than_seconds)
        for refund in claimed:
            try:
                await self._complete(refund, source="reconcile")
            except (Unavailable, FailedPrecondition) as exc:
                log.warning("pending refund not finished", extra={"refund_id": refund.id, "error": str(exc)})
        return len(claimed)

    async def get_refund(self, refund_id: str) -> RefundView:
        refund = await self.refund_rows.get(parse_uuid("refund_id", refund_id))
        if refund is None:
            raise NotFound(f"refund {refund_id} not found")
        return refund

