"""The payments core: the one `finalize` every source goes through, and the use cases built on it.

This is the Python API the checkout saga (payments/checkout/) codes against; keep its signatures
stable. docs/payments.md, "Finalize: one path for every source", is the specification, and
docs/architecture.md, "Decisions, and why", says why there is one path. A payment's status change
wakes its checkout saga in the database (the `payments_wake_checkout` trigger,
migrations/functions/checkouts_wake_on_payment.sql): this module knows nothing about checkouts.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime, timezone
from typing import Any

import asyncpg
from opentelemetry import trace

from cutylib import tenancy
from cutylib.config import Settings
from cutylib.errors import Aborted, FailedPrecondition, NotFound, Unavailable, require
from cutylib.fields import parse_uuid
from cutylib.money import require_amount, require_currency
from cutylib.principal import Principal
from cutylib.telemetry import current_trace_id

from . import domain, metrics as m, repository as sql
from .domain import Outcome
from .operator import OperatorReads
from .psp import PspClient, PspError, PspUnavailable
from .refunds import RefundCases
from .settings import PaymentsOptions, new_worker_id
from .views import CapturedPayment, PaymentView, TimelineEvent

__all__ = ["PaymentsCore", "PaymentView", "TimelineEvent"]

log = logging.getLogger(__name__)
tracer = trace.get_tracer("cuty.payments")

# Each version conflict means another writer made a forward step, and a payment has at most four,
# so the loop ends long before this; the bound only guards against a bug looping forever.
MAX_FINALIZE_ROUNDS = 16


class PaymentsCore(RefundCases):
    def __init__(self, settings: Settings, pool: asyncpg.Pool, psp: PspClient, *,
                 options: PaymentsOptions | None = None, metrics: m.PaymentsMetrics | None = None,
                 worker_id: str | None = None):
        self.settings = settings
        self.pool = pool
        # The payments and refunds rows, on the pool (finalize uses its own connection's).
        self.rows = sql.Payments(pool)
        self.refund_rows = sql.Refunds(pool)
        self.psp = psp
        self.options = options or PaymentsOptions()
        self.metrics = metrics if metrics is not None else m.REGISTRY
        # The lease owner identity of this process (or of this core, in tests with several).
        self.worker_id = worker_id or new_worker_id()

    # -- reads ----------------------------------------------------------------------------------------
    async def find_by_key(self, merchant_id: str, idempotency_key: str) -> PaymentView | None:
        """The payment created with `idempotency_key` (the payment attempt id) in its merchant, if any."""
        return await self.rows.by_key(merchant_id, idempotency_key)

    async def get(self, payment_id: str, *, seen_by: Principal | None = None) -> PaymentView:
        """The payment; for a user (`seen_by`) only within their merchant: another
        merchant's payment is not found, and Row-Level Security narrows the read as well."""
        pid = parse_uuid("payment_id", payment_id)
        payment = await (self.rows.get(pid) if seen_by is None else self.rows.get_seen_by(pid, seen_by))
        if payment is None:
            raise NotFound(f"payment {payment_id} not found")
        return payment

    async def timeline(self, payment_id: str, *, seen_by: Principal | None = None, after_seq: int = 0,
                       limit: int = 10_000) -> list[TimelineEvent]:
        """The payment's events (and its checkout's saga transitions) oldest first, after `after_seq`."""
        payment = await self.get(payment_id, seen_by=seen_by)
        return await self.rows.timeline(payment, after_seq, limit, seen_by)

    async def audit_operator_read(self, caller: Principal, rpc: str, object_id: str, merchant_id: str | None) -> None:
        await OperatorReads(self.pool).record(caller, rpc, object_id, merchant_id)

    async def captured_payments(self, checkout_id: str, purchase_payment_id: str | None, purchase_key: str,
                                other_key_prefix: str) -> list[CapturedPayment]:
        """A checkout's captured payments, the purchase's first (CAPTURED_PAYMENTS): what is left of
        each, and what the refund on its key asked of it before (None: nothing yet)."""
        return await self.rows.captured_payments(checkout_id, purchase_payment_id, purchase_key, other_key_prefix)

    # -- charge -----------------------------------------------------------------------------------------
    async def create_and_charge(self, *, checkout_id: str | None, amount_minor: int, currency: str,
                                payment_method: str, idempotency_key: str, customer_id: str,
                                merchant_id: str, off_session: str | None = None,
                                psp_customer: str | None = None, consent_minor: int | None = None) -> PaymentView:
        """Create the payment (idempotently on `idempotency_key`, also the PSP's Idempotency-Key) and
        charge it. A PSP timeout leaves it non-terminal (`created`) for reconciliation. `off_session`
        'setup': the PSP saves the card for one later charge; 'charge': charge the card saved for
        `psp_customer` (`payment_method` its saved id) without the customer. `consent_minor`: a
        payment link's ('setup' on the hosted page): the PSP's page asks the customer's consent to
        that later charge and saves the card only if they give it."""
        require(bool(idempotency_key), "idempotency_key", "idempotency_key must not be empty")
        require_amount("amount.amount_minor", amount_minor, positive=True)
        require_currency("amount.currency_code", currency)
        domain.require_payment_method(payment_method)
        require(bool(merchant_id) and len(merchant_id) <= tenancy.MAX_MERCHANT_ID_LENGTH, "merchant_id",
                f"merchant_id must be 1..{tenancy.MAX_MERCHANT_ID_LENGTH} characters (the merchant paid)")
        checkout = parse_uuid("checkout_id", checkout_id) if checkout_id else None
        idempotency_key = str(idempotency_key)
        payment_id = uuid.uuid4()
        # The payment and its "created" event: one statement, so one implicit transaction.
        payment = await self.rows.insert(payment_id, checkout, customer_id or "", amount_minor, currency,
                                         payment_method, idempotency_key, self.settings.reconcile_after_seconds,
                                         current_trace_id(), merchant_id, off_session, psp_customer, consent_minor)
        if payment is None:  # the key was used before: same request -> first answer, other request -> refused
            payment = await self.rows.by_key(merchant_id, idempotency_key)
            asked = (_str(checkout), customer_id or "", amount_minor, currency, payment_method, off_session,
                     consent_minor)
            had = (payment.checkout_id, payment.customer_id, payment.amount_minor, payment.currency,
                   payment.payment_method, payment.off_session, payment.consent_minor)
            if asked != had:
                raise FailedPrecondition(f"idempotency key {idempotency_key!r} was used for a different payment",
                                         reason="idempotency-key-reused")
            if payment.status != domain.CREATED:
                return payment
        trace.get_current_span().set_attribute("cuty.payment.id", payment.id)
        # Still `created`: charge (again). The PSP dedupes on the key, so a replay never charges twice.
        try:
            intent = await self._create_intent(payment)
        except PspUnavailable as exc:
            log.warning("charge outcome unknown; reconciliation will ask the PSP",
                        extra={"payment_id": payment.id, "error": str(exc)})
            return await self.get(payment.id)
        except PspError as exc:
            return await self._refused(payment, exc)
        # The payment we hold is the finalize's first read: if another path moved it meanwhile (a
        # webhook that beat the answer), the version token refuses the write and finalize re-reads.
        view, _ = await self.finalize_outcome(payment.id, domain.status_of_intent(intent), "sync", intent=intent,
                                              known=payment)
        return view

    async def _create_intent(self, payment: PaymentView) -> dict[str, Any]:
        body = domain.intent_body(payment_id=payment.id, checkout_id=payment.checkout_id,
                                  amount_minor=payment.amount_minor, currency=payment.currency,
                                  payment_method=payment.payment_method, off_session=payment.off_session,
                                  psp_customer=payment.psp_customer, consent_minor=payment.consent_minor)
        return await self.psp.create_intent(payment.idempotency_key, body)

    async def consent_accepted_at(self, payment_id: str) -> datetime | None:
        """When the customer consented, on a payment link's hosted page, to the later off-session
        charge it asked about (exactly the payment's `consent_minor`), asked of the PSP; None when
        nothing was asked or they did not consent. PspUnavailable: not known now."""
        view = await self.get(payment_id)
        if view.consent_minor is None or not view.psp_intent_id:
            return None
        consent = (await self.psp.get_intent(view.psp_intent_id)).get("off_session_consent")
        if not isinstance(consent, dict) or consent.get("accepted") is not True \
                or consent.get("amount") != view.consent_minor or not isinstance(consent.get("accepted_at"), int):
            return None
        return datetime.fromtimestamp(consent["accepted_at"], timezone.utc)

    async def saved_card(self, payment_id: str) -> tuple[str, str] | None:
        """(the PSP's customer, the saved payment method) of a captured purchase whose card was saved
        for off-session use (`off_session` 'setup'), asked of the PSP (it keeps the card); None when
        nothing was saved. PspUnavailable: not known now."""
        view = await self.get(payment_id)
        if view.off_session != domain.OFF_SESSION_SETUP or view.status not in (domain.SUCCEEDED, domain.PARTIALLY_REFUNDED, domain.REFUNDED) or not view.psp_intent_id:
            return None
        intent = await self.psp.get_intent(view.psp_intent_id)
        customer, method = intent.get("customer"), intent.get("saved_payment_method")
        if not isinstance(customer, str) or not isinstance(method, str) or not customer or not method:
            return None
        return customer, method

    async def _refused(self, payment: PaymentView, exc: PspError) -> PaymentView:
        if exc.status in (400, 402, 404):  # a refused create charged nothing: the payment failed
            return await self.finalize(payment.id, domain.FAILED, "sync",
                                       intent={"last_payment_error": {"code": exc.code or f"http_{exc.status}"}},
                                       note=str(exc))
        # 409/422 on a create built only from our own row means something is off at the PSP: leave
        # the payment non-terminal and let reconciliation ask again rather than guess.
        log.error("PSP refused a charge replay", extra={"payment_id": payment.id, "error": str(exc)})
        return await self.get(payment.id)

    # -- finalize -------------------------------------------------------------------------------------
    async def finalize(self, payment_id: str, observed_status: str, source: str, *,
                       intent: dict[str, Any] | None = None, note: str = "") -> PaymentView:
        """Apply what a source observed (`intent`: the PSP object it came with) and return the payment
        as re-read afterwards. Version conflicts are retried here, never raised."""
        view, _ = await self.finalize_outcome(payment_id, observed_status, source, intent=intent, note=note)
        return view

    async def finalize_outcome(self, payment_id: Any, observed: str, source: str, *,
                               intent: dict[str, Any] | None = None,
                               note: str = "", leased: bool = False,
                               known: PaymentView | None = None) -> tuple[PaymentView, Outcome]:
        """`finalize`, also saying what happened (applied, same, stale, contradicts). `leased`: the
        caller holds the payment's lease (webhook and reconcile paths). `known`: the payment the
        caller just read or wrote, used as the first read (the version token fences it if stale)."""
        pid = parse_uuid("payment_id", payment_id)
        if source not in domain.SOURCES:
            raise ValueError(f"source must be one of {', '.join(domain.SOURCES)}, got {source!r}")
        obs = domain.observation_of(intent)
        with tracer.start_as_current_span("payments.finalize", attributes={
                "cuty.payment.id": str(pid), "cuty.payment.source": source, "cuty.payment.observed": observed}):
            # One connection for read, write and re-read.
            async with self.pool.acquire() as conn:
                rows = sql.Payments(conn)
                for _ in range(MAX_FINALIZE_ROUNDS):
                    if known is not None:  # step 2, already done by the caller
                        read, known = known, None
                    else:
                        read = await rows.get(pid)  # step 2: read with its version
                    if read is None:
                        raise NotFound(f"payment {pid} not found")
                    outcome = domain.decide(read.status, observed)  # step 3
                    if obs.psp_intent_id and read.psp_intent_id and obs.psp_intent_id != read.psp_intent_id:
                        outcome = Outcome.CONTRADICTS  # an object of another intent never moves this payment
                    if outcome is not Outcome.APPLY:
                        self._no_change(read, observed, source, outcome)
                        if outcome is Outcome.SAME and obs.psp_intent_id and read.psp_intent_id is None:
                            # Nothing to transition, but learn the intent id (needed to cancel or refund).
                            read = (await rows.learn_intent(pid, obs.psp_intent_id) or await rows.get(pid))
                        return read, outcome
                    if leased and self.options.test_pause_after_lease_ms:
                        log.warning("test hook: pausing between lease and write", extra={
                            "payment_id": str(pid), "version": read.version, "worker": self.worker_id})
                        await asyncio.sleep(self.options.test_pause_after_lease_ms / 1000)
                    written = await self._write(rows, read, observed, source, obs, note)  # steps 4 and 5
                    if written is not None:
                        # What the caller is told is never older than its own write: the UPDATE's
                        # RETURNING row. A payment waiting for the customer is re-read, so one that
                        # another path completed meanwhile is answered without its secret.
                        if domain.shows_customer_action(written.status):
                            written = await rows.get(pid)
                        self.metrics.finalize.labels(source, "applied").inc()
                        return written, Outcome.APPLY
                    self.metrics.version_conflicts.inc()
                    log.info("version conflict, re-reading", extra={
                        "payment_id": str(pid), "version": read.version, "source": source,
                        "worker": self.worker_id})
            raise Aborted(f"payment {pid} kept changing under finalize", reason="version-conflict")

    async def _write(self, rows: sql.Payments, read: PaymentView, observed: str, source: str,
                     obs: domain.Observation, note: str) -> PaymentView | None:
        """The updated payment, or None when the version moved (another path won)."""
        # One statement is one transaction: the UPDATE, its event and (by trigger, payments_wake_checkout)
        # the checkout saga's wake-up commit together.
        return await rows.write(read, observed, obs.psp_intent_id, obs.redirect_url, obs.client_secret,
                                obs.failure_reason if observed == domain.FAILED else None, obs.psp_refund_id,
                                source, current_trace_id(), note)

    def _no_change(self, read: PaymentView, observed: str, source: str, outcome: Outcome) -> None:
        fields = {"payment_id": read.id, "status": read.status, "observed": observed, "source": source}
        self.metrics.finalize.labels(source, outcome.value).inc()
        if outcome is Outcome.STALE:
            log.info("stale observation ignored", extra=fields)
        elif outcome is Outcome.CONTRADICTS:
            log.warning("observation contradicts the payment", extra=fields)

    # -- leases (webhook and reconciliation paths) ----------------------------------------------------
    async def take_lease(self, payment_id: Any) -> bool:
        taken, previous_owner = await self.rows.take_lease(parse_uuid("payment_id", payment_id), self.worker_id,
                                                           self.settings.lease_seconds)
        if not taken:
            return False
        self._note_takeover(payment_id, previous_owner)
        return True

    def _note_takeover(self, payment_id: Any, previous_owner: str | None) -> None:
        if previous_owner is not None and previous_owner != self.worker_id:
            self.metrics.lease_takeovers.inc()
            log.warning("took over an expired payment lease", extra={
                "payment_id": str(payment_id), "previous_owner": previous_owner, "worker": self.worker_id})

    async def release_lease(self, payment_id: Any) -> None:
        await self.rows.release_lease(parse_uuid("payment_id", payment_id), self.worker_id)

    async def finalize_leased(self, payment_id: str, observed_status: str, source: str, *,
                              intent: dict[str, Any] | None = None, note: str = "") -> PaymentView | None:
        """Finalize under the payment's lease; None (and counted) when another worker holds it, so
        the caller defers. An observation that contradicts the row is settled by asking the PSP."""
        if not await self.take_lease(payment_id):
            self.metrics.deferred_finalizes.inc()
            return None
        try:
            view, outcome = await self.finalize_outcome(payment_id, observed_status, source, intent=intent, note=note,
                                                 leased=True)
            if outcome is Outcome.CONTRADICTS and view.psp_intent_id:
                fresh = await self.psp.get_intent(view.psp_intent_id)
                view, _ = await self.finalize_outcome(payment_id, domain.status_of_intent(fresh), source, intent=fresh,
                                               note=f"re-fetched from the PSP: {source} said {observed_status}",
                                               leased=True)
            return view
        finally:
            await self.release_lease(payment_id)

    async def ask_psp(self, view: PaymentView) -> dict[str, Any]:
        """The PSP's current intent for a payment; without an intent id yet (the create timed out),
        replay the create with the same key and body, which returns the same intent."""
        if view.psp_intent_id:
            return await self.psp.get_intent(view.psp_intent_id)
        return await self._create_intent(await self.rows.get(uuid.UUID(view.id)))

    # -- cancel and refund ----------------------------------------------------------------------------
    async def cancel(self, payment_id: str) -> PaymentView:
        """Cancel at the PSP. If the PSP says the payment already succeeded, that is what is returned
        (and recorded): the caller then refunds instead."""
        view = await self.get(payment_id)
        if view.terminal:
            return view
        try:
            intent = await self.ask_psp(view)
            if domain.status_of_intent(intent) in domain.NON_TERMINAL:
                intent = await self.psp.cancel_intent(intent["id"])
        except PspError as exc:
            if exc.payment_intent is None:
                raise FailedPrecondition(f"the PSP refused to cancel payment {view.id}: {exc.code}",
                                         reason="psp-refused") from exc
            intent = exc.payment_intent
        except PspUnavailable as exc:
            raise Unavailable(f"PSP unavailable while cancelling payment {view.id}; retry") from exc
        return await self.finalize(view.id, domain.status_of_intent(intent), "sync", intent=intent,
                                   note="cancel requested")

    async def find_by_intent(self, psp_intent_id: str, *, seen_by: Principal) -> PaymentView | None:
        """The payment of a PSP payment intent (staff's lookup, within their merchant), if any."""
        return await self.rows.by_intent_seen_by(psp_intent_id, seen_by)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
