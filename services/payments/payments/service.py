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
from typing import Any

import asyncpg
from opentelemetry import trace

from cutylib import crash, tenancy
from cutylib.config import Settings
from cutylib.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound, Unavailable, require
from cutylib.fields import parse_uuid
from cutylib.money import require_amount, require_currency
from cutylib.principal import Principal
from cutylib.telemetry import current_trace_id

from . import domain, metrics as m, repository as sql
from .domain import Outcome
from .psp import PspClient, PspError, PspUnavailable
from .settings import PaymentsOptions, new_worker_id
from .views import PaymentView, RefundView, TimelineEvent

__all__ = ["PaymentsCore", "PaymentView", "TimelineEvent"]

log = logging.getLogger(__name__)
tracer = trace.get_tracer("cuty.payments")

# Each version conflict means another writer made a forward step, and a payment has at most four,
# so the loop ends long before this; the bound only guards against a bug looping forever.
MAX_FINALIZE_ROUNDS = 16
# A refund's Idempotency-Key, as stored (refunds.key).
MAX_REFUND_KEY = 255


class PaymentsCore:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, psp: PspClient, *,
                 options: PaymentsOptions | None = None, metrics: m.PaymentsMetrics | None = None,
                 worker_id: str | None = None):
        self.settings = settings
        self.pool = pool
        self.psp = psp
        self.options = options or PaymentsOptions()
        self.metrics = metrics if metrics is not None else m.REGISTRY
        # The lease owner identity of this process (or of this core, in tests with several).
        self.worker_id = worker_id or new_worker_id()

    # -- reads ----------------------------------------------------------------------------------------
    async def find_by_key(self, merchant_id: str, idempotency_key: str) -> PaymentView | None:
        """The payment created with `idempotency_key` (the payment attempt id) in its merchant, if any."""
        row = await self.pool.fetchrow(sql.GET_BY_KEY, merchant_id, idempotency_key)
        return PaymentView.from_row(row) if row is not None else None

    async def get(self, payment_id: str, *, seen_by: Principal | None = None) -> PaymentView:
        """The payment; for a user (`seen_by`) only within their merchant: another
        merchant's payment is not found, and Row-Level Security narrows the read as well."""
        pid = parse_uuid("payment_id", payment_id)
        if seen_by is None:
            row = await self.pool.fetchrow(sql.GET_PAYMENT, pid)
        else:
            row = await tenancy.fetchrow(self.pool, sql.GET_PAYMENT_SEEN_BY, pid, tenancy.merchant_filter(seen_by),
                                         principal=seen_by)
        if row is None:
            raise NotFound(f"payment {payment_id} not found")
        return PaymentView.from_row(row)

    async def timeline(self, payment_id: str, *, seen_by: Principal | None = None, after_seq: int = 0,
                       limit: int = 10_000) -> list[TimelineEvent]:
        """The payment's events (and its checkout's saga transitions) oldest first, after `after_seq`."""
        payment = await self.get(payment_id, seen_by=seen_by)
        rows = await tenancy.fetch(self.pool, sql.TIMELINE, uuid.UUID(payment.id),
                                   uuid.UUID(payment.checkout_id) if payment.checkout_id else None,
                                   after_seq, limit, payment.merchant_id, principal=seen_by)
        return [TimelineEvent.from_row(r) for r in rows]

    async def audit_operator_read(self, caller: Principal, rpc: str, object_id: str, merchant_id: str | None) -> None:
        """The platform's operator reads across merchants, and every such read is kept
        (who, what, whose), before the answer leaves."""
        if caller.role == tenancy.OPERATOR_ROLE:
            await self.pool.execute(sql.AUDIT_OPERATOR_READ, caller.subject, rpc, object_id, merchant_id,
                                    current_trace_id())

    async def append_event(self, conn: asyncpg.Connection, *, payment_id: str | None, checkout_id: str | None,
                           source: str, from_status: str | None, to_status: str, version: int | None,
                           note: str = "") -> int:
        """Append to the payment event log on `conn` (the caller's transaction); returns its seq."""
        if source not in domain.SOURCES:
            raise ValueError(f"source must be one of {', '.join(domain.SOURCES)}, got {source!r}")
        return await conn.fetchval(
            sql.INSERT_EVENT, parse_uuid("payment_id", payment_id) if payment_id else None,
            parse_uuid("checkout_id", checkout_id) if checkout_id else None,
            source, from_status, to_status, version, current_trace_id(), note)

    # -- charge -----------------------------------------------------------------------------------------
    async def create_and_charge(self, *, checkout_id: str | None, amount_minor: int, currency: str,
                                payment_method: str, idempotency_key: str, customer_id: str,
                                merchant_id: str) -> PaymentView:
        """Create the payment (idempotently on `idempotency_key`, also the PSP's Idempotency-Key) and
        charge it. A PSP timeout leaves it non-terminal (`created`) for reconciliation."""
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
        row = await self.pool.fetchrow(sql.INSERT_PAYMENT, payment_id, checkout, customer_id or "", amount_minor,
                                       currency, payment_method, idempotency_key,
                                       float(self.settings.reconcile_after_seconds), current_trace_id(), merchant_id)
        if row is None:  # the key was used before: same request -> first answer, other request -> refused
            row = await self.pool.fetchrow(sql.GET_BY_KEY, merchant_id, idempotency_key)
            asked = (checkout, customer_id or "", amount_minor, currency, payment_method)
            had = (row["checkout_id"], row["customer_id"], row["amount_minor"], row["currency"], row["payment_method"])
            if asked != had:
                raise FailedPrecondition(f"idempotency key {idempotency_key!r} was used for a different payment",
                                         reason="idempotency-key-reused")
            if row["status"] != domain.CREATED:
                return PaymentView.from_row(row)
        trace.get_current_span().set_attribute("cuty.payment.id", str(row["id"]))
        # Still `created`: charge (again). The PSP dedupes on the key, so a replay never charges twice.
        try:
            intent = await self._create_intent(row)
        except PspUnavailable as exc:
            log.warning("charge outcome unknown; reconciliation will ask the PSP",
                        extra={"payment_id": str(row["id"]), "error": str(exc)})
            return await self.get(row["id"])
        except PspError as exc:
            return await self._refused(row, exc)
        # The row we hold is the finalize's first read: if another path moved the payment meanwhile
        # (a webhook that beat the answer), the version token refuses the write and finalize re-reads.
        view, _ = await self.finalize_outcome(row["id"], domain.status_of_intent(intent), "sync", intent=intent,
                                              known=row)
        return view

    async def _create_intent(self, row: Any) -> dict[str, Any]:
        body = domain.intent_body(payment_id=str(row["id"]), checkout_id=_str(row["checkout_id"]),
                                  amount_minor=row["amount_minor"], currency=row["currency"],
                                  payment_method=row["payment_method"])
        return await self.psp.create_intent(row["idempotency_key"], body)

    async def _refused(self, row: Any, exc: PspError) -> PaymentView:
        if exc.status in (400, 402, 404):  # a refused create charged nothing: the payment failed
            return await self.finalize(row["id"], domain.FAILED, "sync",
                                       intent={"last_payment_error": {"code": exc.code or f"http_{exc.status}"}},
                                       note=str(exc))
        # 409/422 on a create built only from our own row means something is off at the PSP: leave
        # the payment non-terminal and let reconciliation ask again rather than guess.
        log.error("PSP refused a charge replay", extra={"payment_id": str(row["id"]), "error": str(exc)})
        return await self.get(row["id"])

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
                               known: Any = None) -> tuple[PaymentView, Outcome]:
        """`finalize`, also saying what happened (applied, same, stale, contradicts). `leased`: the
        caller holds the payment's lease (webhook and reconcile paths). `known`: the payment row the
        caller just read or wrote, used as the first read (the version token fences it if stale)."""
        pid = parse_uuid("payment_id", payment_id)
        if source not in domain.SOURCES:
            raise ValueError(f"source must be one of {', '.join(domain.SOURCES)}, got {source!r}")
        obs = domain.observation_of(intent)
        with tracer.start_as_current_span("payments.finalize", attributes={
                "cuty.payment.id": str(pid), "cuty.payment.source": source, "cuty.payment.observed": observed}):
            # One connection for read, write and re-read.
            async with self.pool.acquire() as conn:
                for _ in range(MAX_FINALIZE_ROUNDS):
                    if known is not None:  # step 2, already done by the caller
                        row, known = known, None
                    else:
                        row = await conn.fetchrow(sql.GET_PAYMENT, pid)  # step 2: read with its version
                    if row is None:
                        raise NotFound(f"payment {pid} not found")
                    outcome = domain.decide(row["status"], observed)  # step 3
                    if obs.psp_intent_id and row["psp_intent_id"] and obs.psp_intent_id != row["psp_intent_id"]:
                        outcome = Outcome.CONTRADICTS  # an object of another intent never moves this payment
                    if outcome is not Outcome.APPLY:
                        self._no_change(row, observed, source, outcome)
                        if outcome is Outcome.SAME and obs.psp_intent_id and row["psp_intent_id"] is None:
                            # Nothing to transition, but learn the intent id (needed to cancel or refund).
                            row = (await conn.fetchrow(sql.SET_INTENT_ID, pid, obs.psp_intent_id)
                                   or await conn.fetchrow(sql.GET_PAYMENT, pid))
                        return PaymentView.from_row(row), outcome
                    if leased and self.options.test_pause_after_lease_ms:
                        log.warning("test hook: pausing between lease and write", extra={
                            "payment_id": str(pid), "version": row["version"], "worker": self.worker_id})
                        await asyncio.sleep(self.options.test_pause_after_lease_ms / 1000)
                    written = await self._write(conn, row, observed, source, obs, note)  # steps 4 and 5
                    if written is not None:
                        # What the caller is told is never older than its own write: the UPDATE's
                        # RETURNING row. A payment waiting for the customer is re-read, so one that
                        # another path completed meanwhile is answered without its secret.
                        if domain.shows_customer_action(written["status"]):
                            written = await conn.fetchrow(sql.GET_PAYMENT, pid)
                        self.metrics.finalize.labels(source, "applied").inc()
                        return PaymentView.from_row(written), Outcome.APPLY
                    self.metrics.version_conflicts.inc()
                    log.info("version conflict, re-reading", extra={
                        "payment_id": str(pid), "version": row["version"], "source": source,
                        "worker": self.worker_id})
            raise Aborted(f"payment {pid} kept changing under finalize", reason="version-conflict")

    async def _write(self, conn: asyncpg.Connection, row: Any, observed: str, source: str,
                     obs: domain.Observation, note: str) -> Any:
        """The updated row, or None when the version moved (another path won)."""
        args = (row["id"], row["version"], observed, obs.psp_intent_id, obs.redirect_url, obs.client_secret,
                obs.failure_reason if observed == domain.FAILED else None, obs.psp_refund_id,
                source, row["status"], current_trace_id(), note)
        # One statement is one transaction: the UPDATE, its event and (by trigger, payments_wake_checkout)
        # the checkout saga's wake-up commit together.
        return await conn.fetchrow(sql.FINALIZE, *args)

    def _no_change(self, row: Any, observed: str, source: str, outcome: Outcome) -> None:
        fields = {"payment_id": str(row["id"]), "status": row["status"], "observed": observed, "source": source}
        self.metrics.finalize.labels(source, outcome.value).inc()
        if outcome is Outcome.STALE:
            log.info("stale observation ignored", extra=fields)
        elif outcome is Outcome.CONTRADICTS:
            log.warning("observation contradicts the payment", extra=fields)

    # -- leases (webhook and reconciliation paths) ----------------------------------------------------
    async def take_lease(self, payment_id: Any) -> bool:
        row = await self.pool.fetchrow(sql.TAKE_LEASE, parse_uuid("payment_id", payment_id), self.worker_id,
                                       float(self.settings.lease_seconds))
        if row is None:
            return False
        self._note_takeover(payment_id, row["previous_owner"])
        return True

    def _note_takeover(self, payment_id: Any, previous_owner: str | None) -> None:
        if previous_owner is not None and previous_owner != self.worker_id:
            self.metrics.lease_takeovers.inc()
            log.warning("took over an expired payment lease", extra={
                "payment_id": str(payment_id), "previous_owner": previous_owner, "worker": self.worker_id})

    async def release_lease(self, payment_id: Any) -> None:
        await self.pool.execute(sql.RELEASE_LEASE, parse_uuid("payment_id", payment_id), self.worker_id)

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
        row = await self.pool.fetchrow(sql.GET_PAYMENT, uuid.UUID(view.id))
        return await self._create_intent(row)

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
        row = await tenancy.fetchrow(self.pool, sql.GET_BY_INTENT_SEEN_BY, psp_intent_id,
                                     tenancy.merchant_filter(seen_by), principal=seen_by)
        return PaymentView.from_row(row) if row is not None else None

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
        for row in await self.pool.fetch(sql.PENDING_REFUNDS_OF, uuid.UUID(view.id)):
            if row["key"] != idempotency_key:
                await self._complete(RefundView.from_row(row))
        view = await self.get(view.id)
        if view.status == domain.REFUNDED:
            return view
        # A refund the PSP refused refunded nothing; the saga's retry (an operator's, after fixing the
        # cause) asks again as a new refund: the key with an attempt number.
        key, attempt = idempotency_key, 0
        while (existing := await self.pool.fetchrow(sql.GET_REFUND_BY_KEY, view.merchant_id, uuid.UUID(view.id),
                                                    key)) is not None and existing["status"] == "failed":
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
                row = await uow.conn.fetchrow(sql.RESERVE_REFUND, refund_id, merchant_id, pid, idempotency_key,
                                              amount_minor, reason, actor, codes_delivered_ok, current_trace_id(),
                                              note or f"refund requested by {actor}: {reason}", currency)
                await uow.commit()
        except asyncpg.UniqueViolationError:
            row = None
        if row is None:
            # Nothing written: the key was used before (a replay, answered as the first time), or
            # the refund does not fit (asked again, a replay's "rest" is 0 once its refund counts).
            first = await tenancy.fetchrow(self.pool, sql.GET_REFUND_BY_KEY, merchant_id, pid, idempotency_key,
                                           principal=seen_by)
            if first is not None:
                return await self._replay(first, idempotency_key, amount_minor, currency, reason)
            raise await self._refusal(merchant_id, pid, amount_minor, currency)
        refund = RefundView.from_row(row)
        m.count_refund(self.metrics, "reserved")
        return await self._complete(refund)

    async def _replay(self, row: Any, key: str, amount_minor: int | None, currency: str | None,
                      reason: str) -> RefundView:
        if (row["requested_minor"], row["reason"]) != (amount_minor, reason) or (
                currency is not None and currency != row["currency"]):
            raise FailedPrecondition(f"idempotency key {key!r} was used for another refund of payment "
                                     f"{row['payment_id']}", reason="idempotency-key-reused")
        refund = RefundView.from_row(row)
        m.count_refund(self.metrics, "replayed")
        if refund.status == "failed":
            raise FailedPrecondition(f"the PSP refused refund {refund.id}: {refund.failure_reason}",
                                     reason="psp-refused")
        return await self._complete(refund) if refund.status == "pending" else refund

    async def _refusal(self, merchant_id: str, pid: uuid.UUID, amount_minor: int | None,
                       currency: str | None) -> Exception:
        """Why RESERVE_REFUND wrote nothing, as the error to raise."""
        row = await self.pool.fetchrow(sql.REFUND_REFUSAL, pid, merchant_id)
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
        payment = await self.pool.fetchrow(sql.GET_PAYMENT, uuid.UUID(refund.payment_id))
        try:
            answer = await self.psp.create_refund(refund.id, payment["psp_intent_id"],
                                                  {"payment_id": refund.payment_id, "refund_id": refund.id},
                                                  amount=refund.amount_minor)
        except PspUnavailable as exc:
            m.count_refund(self.metrics, "pending")
            raise Unavailable(f"PSP unavailable while refunding payment {refund.payment_id}; the refund "
                              f"{refund.id} is pending: retry with the same Idempotency-Key") from exc
        except PspError as exc:
            row = await self.pool.fetchrow(sql.FAIL_REFUND, uuid.UUID(refund.id), exc.code or f"http_{exc.status}",
                                           current_trace_id())
            m.count_refund(self.metrics, "failed")
            raise FailedPrecondition(f"the PSP refused refund {refund.id} of payment {refund.payment_id}: "
                                     f"{exc.code}", reason="psp-refused") from exc
        crash.point("psp_refund:after")
        row = await self.pool.fetchrow(sql.SETTLE_REFUND, uuid.UUID(refund.id), str(answer.get("id") or ""),
                                       current_trace_id(), source)
        if row is None:  # settled meanwhile by another retry (or reconciliation): the same answer
            row = await self.pool.fetchrow(sql.GET_REFUND, uuid.UUID(refund.id))
        else:
            m.count_refund(self.metrics, "succeeded")
        return RefundView.from_row(row)

    async def finish_pending_refunds(self, older_than_seconds: float, limit: int = 20) -> int:
        """Reconciliation of refunds left pending (PSP timeouts, crashes): claim a batch (SKIP LOCKED;
        the claim moves the refund's updated_at, so replicas do not ask twice at once) and ask the PSP
        again with the same key. Returns how many were claimed."""
        rows = await self.pool.fetch(sql.CLAIM_PENDING_REFUNDS, limit, float(older_than_seconds))
        for row in rows:
            try:
                await self._complete(RefundView.from_row(row), source="reconcile")
            except (Unavailable, FailedPrecondition) as exc:
                log.warning("pending refund not finished", extra={"refund_id": str(row["id"]), "error": str(exc)})
        return len(rows)

    async def get_refund(self, refund_id: str) -> RefundView:
        row = await self.pool.fetchrow(sql.GET_REFUND, parse_uuid("refund_id", refund_id))
        if row is None:
            raise NotFound(f"refund {refund_id} not found")
        return RefundView.from_row(row)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
