"""Checkout use cases: create (HOLD, synchronously), pay, get, cancel.

Each takes the caller (never a body field) and does its first write as one conditional statement
that also takes the saga lease; the steps that follow are the engine's, the same code the workers
run, so a request that dies half-way is finished by a worker exactly as if it had been one.
"""
from __future__ import annotations

import dataclasses
import secrets
import uuid

import asyncpg

from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2
from cutylib import deadlines, errors, paging, tenancy
from cutylib.db import reports
from cutylib.fields import canonical_uuid
from cutylib.money import require_money
from cutylib.principal import Principal
from cutylib.telemetry import set_span_attributes

from ..domain import require_payment_method
from ..operator import OperatorReads
from ..views import PaymentView
from . import diagnostics, domain, repository as repo
from .answers import CheckoutAnswer, CheckoutPage
from .domain import Saga
from .engine import Engine
from .idempotency import IdempotencyStore, request_hash
from .live import Watchers
from .metrics import CheckoutMetrics
from .ports import Payments
from .remote import Inventory, Refused, Rejected
from .reschedule import refuse_unasked_charge

# Callers who may read any checkout (staff see it without the buyer's action or codes).
# Who reads any checkout of their merchant (staff and admins their own merchant's, the
# platform's operator and the system every merchant's).
STAFF_ROLES = ("staff", "admin", "operator", "system")

# Cancel re-reads and retries when a concurrent step moved the saga between its read and write.
CANCEL_ROUNDS = 5


def _cancelled_after_purchase(saga: Saga) -> bool:
    """A cancel after purchase has begun (a repeat answers where it stands)."""
    return saga.refund_amount_minor is not None


def _same_slot(slot_id: str) -> errors.InvalidArgument:
    return errors.InvalidArgument("slot_id", f"slot_id must be another slot than the booking's own, got {slot_id}")


def new_owner(kind: str) -> str:
    """A lease owner token: unique per request, so two requests never mistake each other's lease."""
    return f"{kind}:{secrets.token_hex(8)}"


class CheckoutService:
    def __init__(self, pool: asyncpg.Pool, engine: Engine, holds: Inventory, payments: Payments,
                 metrics: CheckoutMetrics, keys: IdempotencyStore, lease_seconds: float,
                 watchers: Watchers | None = None):
        self.pool = pool
        # WatchCheckout's listener and open streams (checkout/live.py); its `run` is a background task.
        self.watchers = watchers
        self.sagas = repo.Sagas(pool)
        self.engine = engine
        self.holds = holds
        self.payments = payments
        self.metrics = metrics
        self.operator_reads = OperatorReads(pool)
        self.keys = keys
        self.lease_seconds = lease_seconds
        # Staff book for a customer (staff_service.StaffBookings), set by wiring.build.
        self.staff = None

    # -- CreateCheckout ---------------------------------------------------------------------------
    async def create(self, customer: str, req: domain.CreateRequest, key: str,
                     accept_no_show_fee: common_pb2.Money | None = None) -> CheckoutAnswer:
        """Hold (HELD); a one-call checkout (`req.payment_method`) is paid in the same request and
        under the same Idempotency-Key: the saga does not stop at HELD but starts the payment (the
        PAY step, PayCheckout's move) and runs on, so the answer is the one PayCheckout gives."""
        parts = [req.kind, req.slot_id or "", req.product_id or "", str(req.quantity)]
        if req.payment_method is not None:
            parts.append(req.payment_method)  # so a key reused with or without a payment is refused
        fee = None
        if accept_no_show_fee is not None:
            if req.payment_method is None or req.kind != domain.BOOKING:
                raise errors.InvalidArgument("accept_no_show_fee", "a no-show fee is accepted with a booking's purchase: "
                                                                   "give payment_method too, or accept it with PayCheckout")
            currency, fee = require_money("accept_no_show_fee", accept_no_show_fee.currency_code,
                                          accept_no_show_fee.amount_minor, positive=True)
            await self._offered_no_show_fee(req.slot_id, currency, fee, None)
            parts.append(f"no-show-fee:{fee}")
        h = request_hash("create", *parts)
        owner = new_owner("create")
        # The PENDING row is inserted by the key's own statement (one round trip).
        first = repo.insert_pending(kind=req.kind, slot_id=req.slot_id, product_id=req.product_id,
                                    quantity=req.quantity, owner=owner, lease_seconds=self.lease_seconds,
                                    payment_method=req.payment_method,
                                    pay_within=_pay_within() if req.payment_method is not None else None,
                                    no_show_fee_minor=fee)
        async with self.keys.claim(customer, "create", key, h, first) as claim:  # or Replay
            claim.finish(await self._create(claim.resource_id, owner, claim.row))
        return claim.answer

    async def _create(self, checkout_id: str, owner: str, row) -> CheckoutAnswer:
        set_span_attributes(checkout_id=checkout_id)
        saga = repo.saga_of_first(row)
        if saga is None:
            # A retry (same Idempotency-Key) of a request that died: resume its checkout.
            saga = await self._resume_pending(checkout_id, owner)
            if not domain.being_created(saga):
                return await self.view(saga)
        try:
            saga, payment = await self.engine.drive(saga, owner)
        except Rejected as rej:
            rej.error.recorded = True  # the checkout is REJECTED: a replay must say so again
            raise rej.error from None
        except Refused as ref:
            await self.sagas.delete_pending(checkout_id, owner)
            raise ref.error from None
        if domain.being_created(saga):
            # The hold's outcome is unknown (a dependency is down), or a one-call checkout's payment
            # could not be started yet. A worker keeps trying with the same keys; a retry with the
            # same Idempotency-Key resumes this checkout.
            raise errors.Unavailable("the checkout could not be created yet; retry with the same Idempotency-Key")
        return await self.view(saga, payment=payment)

    async def _resume_pending(self, checkout_id: str, owner: str) -> Saga:
        saga = await self.sagas.get(checkout_id)
        if saga is None:
            raise errors.Aborted("checkout creation is being retried; retry", reason="idempotency-key-in-flight")
        if saga.state == domain.REJECTED:
            err = errors.AlreadyExists(f"checkout {checkout_id} was rejected: {saga.failure_reason}",
                                       reason=saga.failure_reason or "rejected")
            err.recorded = True
            raise err
        if not domain.being_created(saga):
            return saga
        leased = await self.sagas.take_lease(checkout_id, owner, self.lease_seconds)
        if leased is None:
            raise errors.Aborted("the checkout is being created by another request; retry",
                                 reason="idempotency-key-in-flight")
        return leased

    async def service_slot(self, request: checkout_pb2.CreateCheckoutRequest) -> str:
        """A service time's slot id (booking makes it on first use; the same time is the same slot,
        so an Idempotency-Key's retry resolves to the slot of its first attempt)."""
        if request.slot_id or request.product_id:
            raise errors.InvalidArgument("service_id", "give a service time (service_id, start_time) or slot_id or "
                                                       "product_id, not more than one")
        service_id = canonical_uuid("service_id", request.service_id)
        if not request.HasField("start_time"):
            raise errors.InvalidArgument("start_time", "start_time is required with service_id")
        resource_id = canonical_uuid("resource_id", request.resource_id) if request.resource_id else ""
        return await self.holds.booking.service_slot(service_id, request.start_time, resource_id)

    # -- PayCheckout ------------------------------------------------------------------------------
    async def pay(self, customer: str, checkout_id: str, payment_method: str, key: str,
                  accept_no_show_fee: common_pb2.Money | None = None) -> CheckoutAnswer:
        checkout_id = canonical_uuid("checkout_id", checkout_id)
        require_payment_method(payment_method)
        fee = None
        if accept_no_show_fee is not None:
            fee = await self._accepted_no_show_fee(customer, checkout_id, accept_no_show_fee)
        h = request_hash("pay", checkout_id, payment_method, *([str(fee)] if fee is not None else []))
        owner = new_owner("pay")
        # HELD -> CHARGING is written by the key's own statement (one round trip), with the
        # acceptance of the no-show fee when the customer gave it.
        first = repo.start_charging(checkout_id=checkout_id, payment_key=domain.payment_attempt_id(checkout_id),
                                    payment_method=payment_method, owner=owner, lease_seconds=self.lease_seconds,
                                    pay_within=_pay_within(), no_show_fee_minor=fee)
        async with self.keys.claim(customer, "pay", key, h, first) as claim:  # or Replay
            claim.finish(await self._pay(customer, checkout_id, payment_method, claim.resumed, owner, claim.row))
        return claim.answer

    async def _accepted_no_show_fee(self, customer: str, checkout_id: str, accepted: common_pb2.Money) -> int:
        """The fee the customer accepts, in minor units: exactly what the booking's slot names now
        (the salon's policy), in the checkout's currency, never more than its price. A checkout no
        longer HELD is not checked again here (a retry of the same purchase: its key decides)."""
        currency, amount = require_money("accept_no_show_fee", accepted.currency_code, accepted.amount_minor,
                                         positive=True)
        saga = await self._owned(customer, checkout_id)
        if saga.state != domain.HELD:
            return amount
        if saga.kind != domain.BOOKING or saga.slot_id is None:
            raise errors.InvalidArgument("accept_no_show_fee", "only a booking has a no-show fee")
        if saga.amount_minor is None:
            raise errors.FailedPrecondition(f"checkout {checkout_id} is not held yet", reason="checkout-not-held")
        await self._offered_no_show_fee(saga.slot_id, currency, amount, saga.amount_minor)
        return amount

    async def _offered_no_show_fee(self, slot_id: str, currency: str, amount: int, price_minor: int | None) -> None:
        """Refuses an acceptance of another fee than the slot names now (the salon's policy), or of
        more than the booking's price (`price_minor`, when held)."""
        slot = await self.holds.booking.get_slot(slot_id)
        offered = (slot.no_show_fee.currency_code, slot.no_show_fee.amount_minor) if slot.HasField("no_show_fee") \
            else None
        if offered != (currency, amount) or (price_minor is not None and amount > price_minor):
            shown = f"{offered[1]} {offered[0]}" if offered else "none"
            raise errors.FailedPrecondition(
                f"the booking's no-show fee is {shown} (the salon's policy now), not {amount} {currency}; "
                "read the slot again and accept what it names", reason="no-show-fee-changed")

    async def current_payment(self, checkout_id: str, payment_id: str) -> tuple[Saga | None, PaymentView | None]:
        """The checkout and its payment as they are now, when `payment_id` is still its payment: a
        replayed PayCheckout (or one-call CreateCheckout) answer is stored without the customer
        action (invariant 6), shown again only while the payment, read now, still requires it."""
        saga = await self.sagas.get(checkout_id)
        payment = None
        if saga is not None and saga.payment_id == payment_id:
            payment = await self.payments.get(saga.payment_id)
        return saga, payment

    async def _pay(self, customer: str, checkout_id: str, payment_method: str, resumed: bool, owner: str,
                   row) -> CheckoutAnswer:
        set_span_attributes(checkout_id=checkout_id)
        saga = repo.saga_of_first(row)
        if saga is None:
            # Nothing was written; say why (this read decides no race, only the message).
            current = await self._owned(customer, checkout_id)
            if resumed and current.payment_key is not None and current.payment_method == payment_method:
                # The retry of a pay whose process died after it started charging: the saga went on
                # (a worker resumed it), so the answer is where it stands now, not an error. Its
                # caller is back: the charge, if not started yet, may start within this request's time.
                if current.state == domain.CHARGING and current.payment_id is None:
                    await self.sagas.extend_pay_deadline(checkout_id, _pay_within())
                return await self.view(current)
            if current.state == domain.HELD:
                raise errors.FailedPrecondition(f"the hold of checkout {checkout_id} has expired",
                                                reason="hold-expired")
            raise errors.FailedPrecondition(f"only a HELD checkout can be paid; checkout {checkout_id} is "
                                            f"{current.state}", reason="checkout-not-held")
        # The charge and, when the PSP answers at once, the confirm step run here (the same engine
        # as the workers), so a card that succeeds synchronously answers COMPLETED.
        saga, payment = await self.engine.drive(saga, owner, unpaid=True)
        return await self.view(saga, payment=payment)

    # -- GetCheckout ------------------------------------------------------------------------------
    async def get(self, caller: Principal, checkout_id: str) -> CheckoutAnswer:
        checkout_id = canonical_uuid("checkout_id", checkout_id)
        saga = await self.seen(caller, checkout_id)
        await self.operator_reads.record(caller, "GetCheckout", checkout_id, saga.merchant_id)
        return await self.view_for(caller, saga)

    async def seen(self, caller: Principal, checkout_id: str) -> Saga:
        """The checkout as `caller` may see it: staff and admins their merchant's, a customer their
        own; anyone else's does not exist for them (NOT_FOUND)."""
        if caller.role in STAFF_ROLES:
            saga = await self.sagas.get_seen_by(checkout_id, caller)  # another merchant's: not found
        else:
            saga = await self.sagas.get(checkout_id)
            if saga is not None and saga.customer_id != caller.subject:
                saga = None  # another customer's checkout does not exist for this caller
        if saga is None:
            raise errors.NotFound(f"checkout {checkout_id} not found")
        return saga

    async def view_for(self, caller: Principal, saga: Saga) -> CheckoutAnswer:
        """GetCheckout's answer to `caller` (who may see `saga`): codes, the redirect URL and the
        client secret for the buyer only; the diagnostics for staff only."""
        owner = caller.subject == saga.customer_id
        answer = await self.view(saga, with_codes=owner)
        found = None
        if caller.role in STAFF_ROLES:  # attempts, last error, trace id: never the customer's
            found = await diagnostics.read(self.pool, saga.id)
        return dataclasses.replace(answer, for_buyer=owner, diagnostics=found)

    # -- CancelCheckout ---------------------------------------------------------------------------
    async def cancel(self, customer: str, checkout_id: str) -> CheckoutAnswer:
        """The customer's cancel: before the purchase, the hold goes back (nothing was taken or
        the intent is cancelled); a COMPLETED booking is cancelled after purchase."""
        checkout_id = canonical_uuid("checkout_id", checkout_id)
        owner = new_owner("cancel")
        for _ in range(CANCEL_ROUNDS):
            current = await self._owned(customer, checkout_id)
            if current.outcome == domain.CANCELLED or _cancelled_after_purchase(current):
                return await self.view(current)  # cancelling twice is not an error
            if current.state == domain.COMPLETED:
                saga = await self._start_cancel_after_purchase(current, owner, customer=customer)
            else:
                if current.state not in domain.CANCELLABLE or (
                        current.state == domain.CHARGING and current.payment_id is None):
                    raise errors.FailedPrecondition(
                        f"checkout {checkout_id} is {current.state} and can no longer be cancelled",
                        reason="checkout-not-cancellable")
                # Version-guarded: if a step moved the saga since our read, read again and re-decide.
                saga = await self.sagas.start_cancel(current, owner, self.lease_seconds)
                if saga is None and current.state == domain.CHARGING and domain.captured_status(
                        await self.payments.get(current.payment_id)) == domain.P_SUCCEEDED:
                    # Refused by START_CANCEL: the payment is captured, so the purchase is confirmed.
                    raise errors.FailedPrecondition(
                        f"checkout {checkout_id} is paid and being confirmed; it can no longer be cancelled",
                        reason="checkout-not-cancellable")
            if saga is not None:
                saga, payment = await self.engine.drive(saga, owner)
                return await self.view(saga, payment=payment)
        raise errors.Aborted(f"checkout {checkout_id} kept changing; retry", reason="version-conflict")

    async def cancel_by_staff(self, caller: Principal, checkout_id: str, reason: str) -> CheckoutAnswer:
        """The merchant's staff or admin cancel a COMPLETED booking of their merchant
        (another merchant's: NOT_FOUND) with a full refund and a reason, whenever it starts."""
        checkout_id = canonical_uuid("checkout_id", checkout_id)
        reason = domain.cancel_reason(reason)
        owner = new_owner("cancel")
        for _ in range(CANCEL_ROUNDS):
            current = await self.seen(caller, checkout_id)
            if _cancelled_after_purchase(current):
                return await self.view_for(caller, current)
            if current.state != domain.COMPLETED or current.kind != domain.BOOKING:
                self._refuse_cancel_after_purchase(current)
            async with tenancy.scoped(self.pool, caller) as uow:
                saga = await repo.Sagas(uow.conn).start_cancel_after_purchase(
                    current, owner, self.lease_seconds, customer=None, merchant=tenancy.merchant_filter(caller),
                    who=f"{caller.role}:{caller.subject}", reason=reason)
                await uow.commit()
            if saga is not None:
                saga, _ = await self.engine.drive(saga, owner)
                return await self.view_for(caller, saga)
        raise errors.Aborted(f"checkout {checkout_id} kept changing; retry", reason="version-conflict")

    async def _start_cancel_after_purchase(self, current: Saga, owner: str, *, customer: str) -> Saga | None:
        """COMPLETED -> CANCELLING for its customer, the refund decided by the database (its clock,
        the policy recorded at purchase); None when the row moved meanwhile (read again)."""
        if current.kind != domain.BOOKING:
            self._refuse_cancel_after_purchase(current)
        if current.start_time is None:
            raise errors.FailedPrecondition(
                f"checkout {current.id} was bought before cancellation policies; only the salon's staff can "
                "cancel it", reason="no-cancellation-policy")
        saga = await self.sagas.start_cancel_after_purchase(current, owner, self.lease_seconds, customer=customer,
                                                            merchant=None, who=f"customer:{customer}", reason=None)
        if saga is not None:
            return saga
        again = await self.sagas.get(current.id)
        if again is not None and again.version == current.version:
            # Nothing moved, so the statement refused: the appointment has started (database clock).
            raise errors.FailedPrecondition(
                f"the appointment of checkout {current.id} has started; it can no longer be cancelled",
                reason="appointment-started")
        return None

    @staticmethod
    def _refuse_cancel_after_purchase(current: Saga) -> None:
        if current.kind == domain.CODES and current.state == domain.COMPLETED:
            raise errors.FailedPrecondition(
                f"checkout {current.id} bought codes that were delivered; a codes purchase is not cancelled",
                reason="codes-delivered")
        raise errors.FailedPrecondition(
            f"only a COMPLETED booking is cancelled after purchase; checkout {current.id} is {current.state}",
            reason="checkout-not-cancellable")

    # -- RescheduleCheckout ------------------------------------------------------------------------
    async def reschedule(self, caller: Principal, checkout_id: str, slot_id: str, payment_method: str,
                         key: str) -> CheckoutAnswer:
        """Move a COMPLETED booking to another slot of its salon: its customer until the booking's
        free-cancellation cutoff, staff and admins of its merchant at any time (another's: NOT_FOUND).
        The first write (COMPLETED -> RESCHEDULING) is the Idempotency-Key's own statement; the steps
        are the engine's, driven here and, after a crash, by any worker."""
        checkout_id = canonical_uuid("checkout_id", checkout_id)
        slot_id = canonical_uuid("slot_id", slot_id)
        # Who may see the checkout is asked before any stored answer is given back, and the key is
        # bound to the role and merchant it was used with: the same subject in another role or as
        # another merchant's staff is refused as a reuse, never handed the first answer
        # (docs/security.md, "Replays are the sender's own").
        current = await self.seen(caller, checkout_id)
        h = request_hash("reschedule", checkout_id, slot_id, payment_method, caller.role, caller.org)
        await self.keys.replay_if_answered(caller.require_subject(), "reschedule", key, h)
        staff = caller.role in STAFF_ROLES
        if current.kind != domain.BOOKING:
            raise errors.FailedPrecondition(f"checkout {checkout_id} bought codes; only a booking is rescheduled",
                                            reason="not-a-booking")
        if current.slot_id == slot_id and current.reschedule.slot_id != slot_id:
            # (A retry of the request that moved it there is answered by its key, below.)
            raise _same_slot(slot_id)
        # Checked before anything is held (a slot never changes salon): the same salon and currency.
        slot = await self.holds.booking.get_slot(slot_id)
        if slot.salon_id != (current.salon_id or "") or slot.price.currency_code != (current.currency or ""):
            raise errors.InvalidArgument("slot_id", f"slot_id must be a slot of the booking's salon {current.salon_id} "
                                                    f"in {current.currency}, got a slot of salon {slot.salon_id}")
        refuse_unasked_charge(caller.role, new_minor=slot.price.amount_minor,
                                     paid_minor=current.amount_minor or 0, currency=current.currency)
        method = domain.reschedule_payment_method(payment_method, current)
        if method is None and slot.price.amount_minor > (current.amount_minor or 0):
            raise errors.InvalidArgument("payment_method", "the new slot costs more and the booking was free: "
                                                           "payment_method is required to pay the difference")
        who = f"{caller.role}:{caller.subject}"
        owner = new_owner("reschedule")
        first = repo.start_reschedule(checkout_id=checkout_id, slot_id=slot_id, payment_method=method, who=who,
                                      owner=owner, customer=None if staff else caller.subject,
                                      merchant=tenancy.merchant_filter(caller) if staff else None,
                                      lease_seconds=self.lease_seconds)
        async with self.keys.claim(caller.require_subject(), "reschedule", key, h, first) as claim:
            claim.finish(await self._reschedule(caller, checkout_id, slot_id, claim.resumed, owner, claim.row))
        return claim.answer

    async def _reschedule(self, caller: Principal, checkout_id: str, slot_id: str, resumed: bool, owner: str,
                          row) -> CheckoutAnswer:
        set_span_attributes(checkout_id=checkout_id)
        saga = repo.saga_of_first(row)
        if saga is None:
            current = await self.seen(caller, checkout_id)
            if resumed and current.reschedule.slot_id == slot_id and current.reschedule.status is not None:
                # The retry of a reschedule whose process died: a worker carried it on.
                return await self.view_for(caller, current)
            raise self._not_reschedulable(current, slot_id)
        try:
            saga, _ = await self.engine.drive(saga, owner)
        except Rejected as rej:
            rej.error.recorded = True  # the reschedule was tried and undone: a replay says so again
            raise rej.error from None
        return await self.view_for(caller, saga)

    @staticmethod
    def _not_reschedulable(current: Saga, slot_id: str) -> errors.DomainError:
        """Why START_RESCHEDULE wrote nothing (this read decides no race, only the message)."""
        if current.slot_id == slot_id:
            return _same_slot(slot_id)
        if current.state in domain.RESCHEDULE_STATES:
            return errors.FailedPrecondition(f"checkout {current.id} is being rescheduled already; wait for it",
                                             reason="reschedule-in-progress")
        if current.state != domain.COMPLETED:
            return errors.FailedPrecondition(f"only a COMPLETED booking is rescheduled; checkout {current.id} is "
                                             f"{current.state}", reason="checkout-not-reschedulable")
        if current.start_time is None:
            return errors.FailedPrecondition(f"checkout {current.id} was bought before cancellation policies; only "
                                             "the salon's staff can reschedule it", reason="no-cancellation-policy")
        return errors.FailedPrecondition(
            f"the free-cancellation deadline of checkout {current.id} "
            f"({current.free_cancellation_deadline.isoformat()}) has passed; only the salon's staff can reschedule it",
            reason="reschedule-deadline-passed")

    # -- RetryCheckout (operators) -----------------------------------------------------------------
    async def retry(self, caller: Principal, operator: str, checkout_id: str) -> CheckoutAnswer:
        """NEEDS_ATTENTION -> the step that kept failing, due now; an admin only
        their merchant's."""
        checkout_id = canonical_uuid("checkout_id", checkout_id)
        async with tenancy.scoped(self.pool, caller) as uow:
            saga = await repo.Sagas(uow.conn).retry_by_operator(checkout_id, operator, tenancy.merchant_filter(caller))
            await uow.commit()
        if saga is None:
            current = await self.sagas.get_seen_by(checkout_id, caller)
            if current is None:
                raise errors.NotFound(f"checkout {checkout_id} not found")
            raise errors.FailedPrecondition(f"only a NEEDS_ATTENTION checkout can be retried; checkout {checkout_id} "
                                            f"is {current.state}", reason="checkout-not-needing-attention")
        self.metrics.operator_retries.inc()
        return await self.view(saga)

    # -- ListCheckouts -----------------------------------------------------------------------------
    async def list(self, caller: Principal, filters: domain.ListFilters, page_size: int,
                   page_token: str) -> CheckoutPage:
        """One page, newest first. A customer's own checkouts across merchants (the filters narrow
        only their own); staff and admins their merchant's, filtered in SQL and inside
        tenancy.scoped; the operator every merchant's, each page audited. The token is bound to
        the caller and the filters: replayed with another query it is INVALID_ARGUMENT."""
        size = paging.page_size(page_size)
        if caller.role in STAFF_ROLES:
            scope = repo.ListQuery(merchant_id=tenancy.merchant_filter(caller))
        else:
            scope = repo.ListQuery(customer_id=caller.require_subject())
        q = dataclasses.replace(scope, salon_id=filters.salon_id, product_id=filters.product_id,
                                state=filters.state, created_after=filters.created_after,
                                created_before=filters.created_before)
        fingerprint = paging.query_fingerprint("checkouts", caller.role, q.customer_id, q.merchant_id, q.salon_id,
                                               q.product_id, q.state, filters.created_after_key,
                                               filters.created_before_key)
        key = paging.decode_keyset(page_token, fingerprint, 1)
        after = None if key is None else (key[0], key[1][0])
        async with tenancy.scoped(reports(self.pool), caller) as uow:  # a report: its own pool
            rows = await repo.Sagas(uow.conn).list(q, after, size + 1)
        page = rows[:size]
        if caller.role == tenancy.OPERATOR_ROLE:
            await self.operator_reads.record(caller, "ListCheckouts",
                                                ",".join(s.id for s, _ in page) or "(none)", None)
        token = ""
        if len(rows) > size:
            last, _ = page[-1]
            token = paging.encode_keyset(fingerprint, last.created_at, uuid.UUID(last.id))
        return CheckoutPage(page, token)

    # -- helpers (reads) --------------------------------------------------------------------------
    async def _owned(self, customer: str, checkout_id: str) -> Saga:
        saga = await self.sagas.get(checkout_id)
        if saga is None or saga.customer_id != customer:
            raise errors.NotFound(f"checkout {checkout_id} not found")
        return saga

    async def view(self, saga: Saga, *, with_codes: bool = False, payment=None) -> CheckoutAnswer:
        """The answer, built from the row and the payment as last read (re-read unless the caller
        just read it: a view from before the last transition would be stale)."""
        if saga.payment_id and (payment is None or payment.id != saga.payment_id):
            payment = await self.payments.get(saga.payment_id)
        elif not saga.payment_id:
            payment = None
        codes: list[tuple[str, str]] = []
        if with_codes and saga.kind == domain.CODES and saga.state == domain.COMPLETED:
            codes = await self.holds.codes.delivered_codes(saga)
        return CheckoutAnswer(saga, payment, tuple(codes))


def _pay_within() -> float | None:
    """The seconds in which the request's charge may start (its deadline less the margin its answer
    needs; cutylib.deadlines), recorded with the payment attempt (checkouts.pay_deadline): past
    them nobody waits for this payment, and a worker carrying the saga on ends it uncharged. None
    without a deadline. Counted from the first write's statement, so a wait for a connection makes
    it later by that wait at most; a request that stops marks the exact instant (Sagas.hand_back)."""
    left = deadlines.remaining()
    return None if left is None else max(0.0, left - deadlines.MARGIN_SECONDS)
