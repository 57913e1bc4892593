"""The saga step engine: drives one leased saga until it waits or ends.

`drive()` is the only code that performs saga steps, whoever holds the lease: the synchronous
CreateCheckout / PayCheckout / CancelCheckout paths and the workers. Each round reads what the
step needs, asks domain.next_step what to do, performs it (steps.py; the remote call is idempotent
on its (checkout, step) key) and records the result with one fenced statement. A crash anywhere
leaves the row leased until lease_until, after which any worker repeats the step with the same key.

Round trips are what a checkout costs, so facts learned without a state change (the extension,
the payment id) ride on the next write, and a transition into a waiting state gives the lease back
in the same statement.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

import asyncpg
from opentelemetry import trace

from cutylib import crash, deadlines, errors
from cutylib.backoff import equal_jitter
from cutylib.telemetry import context_of

from . import domain, repository as repo
from .domain import Move, Saga, Step
from .metrics import CheckoutMetrics
from .ports import Payments
from .remote import Inventory, Refused, Rejected, Retryable
from .settings import CheckoutOptions
from .steps import Steps

log = logging.getLogger(__name__)
tracer = trace.get_tracer("cuty.checkout")

# Exceptions that mean "no definitive answer; repeat the step later with the same key".
TRANSIENT = (Retryable, errors.Unavailable, errors.Aborted, asyncpg.PostgresConnectionError,
             asyncpg.InterfaceError, asyncpg.SerializationError, asyncpg.DeadlockDetectedError,
             ConnectionError, OSError, asyncio.TimeoutError)
_NOTHING = repo.Fields()


_KEYED_STATES = (domain.CHARGING, domain.AWAITING_ACTION, domain.RELEASING)

# Steps that call another service (booking, the code pool, the PSP through the payments core).
_CALLS_OUT = frozenset(Step) - {Step.OBSERVE, Step.RESCHEDULE_OBSERVE, Step.EXPIRE, Step.LATE_CAPTURE, Step.WAIT,
                                Step.ABANDON}
# Steps that start moving money: from here on a drive ignores the deadline of the request it runs in.
_CHARGES = frozenset({Step.CHARGE, Step.RESCHEDULE_CHARGE})


def _checkout_trace(saga: Saga):
    """(parent context, links) of a drive: one trace per checkout. Steps continue the trace of
    the request that created the checkout (its traceparent is stored with the row), whoever drives
    them: a worker, or a later request (PayCheckout, CancelCheckout), whose own span is linked."""
    current = trace.get_current_span().get_span_context()
    created = trace.get_current_span(context_of(saga.traceparent)).get_span_context() if saga.traceparent else None
    if created is None or not created.is_valid or (current.is_valid and current.trace_id == created.trace_id):
        return None, ()
    return context_of(saga.traceparent), ([trace.Link(current)] if current.is_valid else ())


class Fenced(Exception):
    """Another actor moved the saga or took its lease: stop; they carry on."""


class OutOfTime(Exception):
    """The request driving the saga has no time left for its next step that calls another service
    (no money has moved yet): the request stops, and a worker carries the saga on."""


def _merge(a, b):
    """`b`'s facts over `a`'s (repo.Fields, and the value objects in it, field by field). Unset is
    None, "" or False; an amount of 0 is a fact (a free item)."""
    def unset(v) -> bool:
        return v is None or v == "" or v is False

    def pick(x, y):
        if unset(y):
            return x
        return _merge(x, y) if dataclasses.is_dataclass(y) and type(x) is type(y) else y
    return type(a)(**{f.name: pick(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)})


class Engine:
    def __init__(self, pool: asyncpg.Pool, holds: Inventory, payments: Payments, metrics: CheckoutMetrics,
                 options: CheckoutOptions, lease_seconds: float):
        self.pool = pool
        self.sagas = repo.Sagas(pool)
        self.payments = payments
        self.metrics = metrics
        self.options = options
        self.lease_seconds = lease_seconds
        self.steps = Steps(holds, payments, metrics, options)

    async def drive(self, saga: Saga, owner: str, payment=None, *, unpaid: bool = False):
        """Run `saga` (whose lease `owner` holds) until it waits or ends and give the lease back.
        Returns (last row seen, last PaymentView read or None). `unpaid`: the caller's own write just
        started the payment attempt (HELD -> CHARGING), so no payment can exist for its key yet.

        Raises Rejected (the hold was refused; the saga is REJECTED) and Refused (bad input; the
        PENDING row stays for the caller to delete); any other failure is retried later.

        Driven by a request (cutylib.deadlines has its deadline): until a charge starts, a step that
        calls another service is started only while the deadline leaves time for it, and its calls
        get at most that time; otherwise the lease goes back (a worker carries on at once, as after
        a cancelled request) and DeadlineExceeded is raised. A saga that already charged (or
        charges in this drive) is driven as by a worker: a deadline never leaves money half-moved.
        The saga's own reads and writes never wait on the request's deadline.

        A request out of time before its charge started marks the paying request's deadline as
        passed (pay_deadline = now, exact where the recorded one is late by the wait for a
        connection): the worker that carries on does not start the charge, nor does any worker
        after the paying request's deadline (Step.ABANDON). A request cancelled by its client is
        not marked: a retry with the same Idempotency-Key may still want the payment."""
        parent, links = _checkout_trace(saga)
        deadline = deadlines.current() if (saga.payment_key is None or unpaid) else None
        with deadlines.detached(), tracer.start_as_current_span(
                "checkout.drive", context=parent, links=links, attributes={"cuty.checkout.id": saga.id}), \
                self._heartbeat(saga.id, owner):
            try:
                return await self._drive(saga, owner, payment, unpaid, deadline)
            except OutOfTime as stop:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.sagas.hand_back(saga.id, owner, caller_gone=True), 1.0)
                raise deadlines.exceeded(f"start the checkout's {stop} step") from None
            except Fenced:
                return await self.sagas.get(saga.id) or saga, None
            except (Rejected, Refused):
                raise
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.sagas.hand_back(saga.id, owner), 1.0)
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is retried; a saga is never dropped
                await self._retry_later(saga, owner, exc)
                return await self.sagas.get(saga.id) or saga, None

    async def _drive(self, saga: Saga, owner: str, payment, unpaid: bool = False, deadline: float | None = None):
        by_request = deadline is not None  # a request waits for this drive (its deadline governs it)
        learned = _NOTHING  # facts a step learned that are not written yet
        key_checked = unpaid
        while not saga.terminal:
            if not key_checked and saga.payment_id is None and saga.payment_key and saga.state in _KEYED_STATES:
                # A crash (or a retried failure) after the charge reached the PSP loses the payment id
                # learned by CHARGE; the payment row, found by its attempt key, still tells. Without
                # this, a saga could release and end with the money captured (invariant 4).
                key_checked = True
                found = await self.payments.find_by_key(saga.merchant_id, saga.payment_key)
                if found is not None:
                    learned = _merge(learned, repo.Fields(payment_id=found.id))
                    saga = dataclasses.replace(saga, payment_id=found.id)
                    payment = found
            if payment is None or payment.id != domain.watched_payment_id(saga):
                payment = await self._payment(saga, payment)
            status = payment.status if payment is not None else None
            step = domain.next_step(saga, status, saga.read_at, self.options.expiry_grace_seconds,
                                    self.options.pay_window_seconds)
            if (not by_request and step in domain.BEFORE_CHARGE
                    and domain.pay_deadline_passed(saga, domain.db_now(saga))):
                # Nobody waits for this payment any more (the paying request's deadline passed):
                # end without charging. The payment was looked up by its attempt key above.
                step = Step.ABANDON
            if self._waits(step, saga, status):
                saga, again = await self._release(saga, owner, learned, status)
                learned = _NOTHING
                if not again:
                    return saga, payment
                payment = None  # a payment changed during our step: look again
                continue
            if step is Step.OBSERVE and domain.confirms_with_capture(saga, payment):
                # The capture is recorded with the confirm's outcome.
                saga, again = await self._confirm_with_capture(saga, owner, payment, learned, status)
                learned = _NOTHING
                if again:
                    payment = None
                elif saga.lease_owner is None:
                    return saga, payment
                continue
            if deadline is not None and step in _CALLS_OUT:
                if deadlines.spent(deadlines.left(deadline)):
                    raise OutOfTime(step.value)
                if step in _CHARGES:
                    deadline = None  # the charge, and all that follows it, as a worker would
            with deadlines.within(deadline):  # the step's calls get at most the request's time left
                out = await self.steps.perform(step, saga, payment, status)
            if step is Step.PAY or (step is Step.HOLD and out.learned.payment_key is not None):
                key_checked = True  # its move starts the payment attempt: no payment has that key yet
            payment = out.payment or payment
            learned = _merge(learned, out.learned)
            if out.move is None:
                # Learned something; keep it in the local row (for next_step) until the next write.
                saga = dataclasses.replace(
                    saga, extended=saga.extended or learned.extended, expire_time=learned.expires or saga.expire_time,
                    payment_id=saga.payment_id or learned.payment_id)
                continue
            saga, again = await self._move(saga, owner, out.move, learned, out.note, status)
            learned = _NOTHING
            if out.raise_after is not None:
                raise out.raise_after
            if again:
                payment = None  # a payment changed during our step: look again
            elif saga.lease_owner is None:
                return saga, payment  # waiting now; the lease went back with the transition
        return saga, payment

    def _waits(self, step: Step, saga: Saga, status: str | None) -> bool:
        if step is Step.RESCHEDULE_OBSERVE:
            return domain.route_reschedule_payment(saga, status, saga.read_at) is None
        return step is Step.WAIT or (step is Step.OBSERVE and domain.route_payment(
            saga, status, saga.read_at, self.options.expiry_grace_seconds) is None)

    async def _payment(self, saga: Saga, current):
        """The payment the step routes on (domain.watched_payment_id), read now where its status decides."""
        watched = domain.watched_payment_id(saga)
        if saga.state in domain.RESCHEDULE_PAYMENT_STATES:
            return await self.payments.get(watched) if watched else None  # none: a price decrease or none yet
        if watched is None or saga.state not in (
                domain.CHARGING, domain.AWAITING_ACTION, domain.RELEASING, domain.REFUNDING):
            return current
        return await self.payments.get(watched)

    async def _move(self, saga: Saga, owner: str, move: Move, learned: repo.Fields, note: str,
                    status: str | None) -> tuple[Saga, bool]:
        """Record `move` (and what was learned). When the saga will then wait, the same statement
        gives the lease back, unless a wake-up came meanwhile. Returns (new row, look again)."""
        fields = dataclasses.replace(learned, outcome=move.outcome or learned.outcome,
                                     failure_reason=move.reason or learned.failure_reason)
        after = dataclasses.replace(saga, state=move.state, outcome=move.outcome or saga.outcome)
        waits = not after.terminal and self._waits(
            domain.next_step(after, status, saga.read_at, self.options.expiry_grace_seconds,
                             self.options.pay_window_seconds), after, status)
        wake_at = domain.wait_until(dataclasses.replace(after, expire_time=fields.expires or saga.expire_time),
                                    self.options.expiry_grace_seconds)
        new = await self.sagas.transition(saga, owner, move.state, fields, note, release=waits, wake_at=wake_at)
        if new is None:
            raise Fenced()
        if new.state != saga.state:
            # E.g. `recorded:COMPLETED`, a crash right after the state change (and
            # the outbox event its trigger wrote) committed, before anything else happens.
            crash.point(f"recorded:{new.state}")
            if new.terminal:
                self.metrics.sagas_finished.labels(new.state).inc()
            log.info("checkout %s -> %s", saga.state, new.state,
                     extra={"checkout_id": saga.id, "from": saga.state, "to": new.state, "note": note})
        return new, waits and new.lease_owner is not None

    async def _confirm_with_capture(self, saga: Saga, owner: str, payment, learned: repo.Fields,
                                    status: str | None) -> tuple[Saga, bool]:
        """domain.confirms_with_capture: the confirm step runs while the row still says CHARGING, and
        the capture is recorded with its COMPLETED (one transition, CHARGING -> COMPLETED). Any other
        end records the capture first, as CONFIRMING, and goes on from there as before: the hold lost
        (-> REFUNDING), or an error (raised, so the confirm is retried from CONFIRMING and, failing
        too long, handed to an operator)."""
        try:
            out = await self.steps.perform(Step.CONFIRM, saga, payment, status)
        except Exception:
            await self._move(saga, owner, Move(domain.CONFIRMING), learned, "", status)
            raise
        if out.move.state == domain.COMPLETED:
            try:
                return await self._move(saga, owner, out.move, _merge(learned, out.learned), out.note, status)
            except asyncpg.CheckViolationError:
                # The database allows CHARGING -> COMPLETED only while the payment is captured, and
                # staff refunded all of it meanwhile: recorded as before the capture was folded in.
                pass
        saga, _ = await self._move(saga, owner, Move(domain.CONFIRMING), learned, "", status)
        return await self._move(saga, owner, out.move, out.learned, out.note, status)

    async def _release(self, saga: Saga, owner: str, learned: repo.Fields, status: str | None) -> tuple[Saga, bool]:
        """Give the lease back (writing what was learned); (row, True) when a wake-up arrived
        during the step and the saga must be looked at again."""
        if learned != _NOTHING:
            return await self._move(saga, owner, Move(saga.state), learned, "", status)
        released = await self.sagas.release(saga, owner, domain.wait_until(saga, self.options.expiry_grace_seconds))
        if released is True:
            return saga, False
        if released is None:
            raise Fenced()
        return released, True

    async def reject(self, saga: Saga, owner: str, reason: str) -> Saga:
        """A PENDING saga whose hold was refused for bad input, found by a worker resuming it (the
        synchronous CreateCheckout deletes the row instead: nothing changes for bad input)."""
        new = await self.sagas.transition(saga, owner, domain.REJECTED, repo.Fields(failure_reason=reason),
                                          "hold refused")
        if new is not None:
            self.metrics.sagas_finished.labels(domain.REJECTED).inc()
        return new or await self.sagas.get(saga.id) or saga

    async def _retry_later(self, saga: Saga, owner: str, exc: BaseException) -> None:
        current = await self.sagas.get(saga.id)
        attempts = current.attempts if current is not None else saga.attempts
        delay = equal_jitter(attempts + 1, self.options.retry_base_seconds, self.options.retry_cap_seconds)
        self.metrics.retries.labels(saga.state).inc()
        level = logging.INFO if isinstance(exc, TRANSIENT) and attempts < 5 else logging.WARNING
        log.log(level, "saga step failed; retrying in %.2fs", delay, exc_info=not isinstance(exc, TRANSIENT),
                extra={"checkout_id": saga.id, "state": saga.state, "attempts": attempts, "error": repr(exc)})
        with contextlib.suppress(*TRANSIENT):
            state = await self.sagas.retry_later(saga, owner, delay, repr(exc),
                                                 max_attempts=self.options.max_attempts,
                                                 attention_after_seconds=self.options.attention_after_seconds)
            if state == domain.NEEDS_ATTENTION:
                self.metrics.need_attention.inc()
                log.error("saga step keeps failing; it needs an operator", extra={
                    "checkout_id": saga.id, "state": saga.state, "attempts": attempts + 1, "error": repr(exc)})

    @contextlib.contextmanager
    def _heartbeat(self, checkout_id: str, owner: str):
        """Keep the lease while a step is slow (a PSP timeout can take seconds), so another replica
        does not start the same step meanwhile (it would be harmless, only wasted)."""
        async def beat() -> None:
            while True:
                await asyncio.sleep(self.lease_seconds / 3)
                with contextlib.suppress(*TRANSIENT):
                    if not await self.sagas.heartbeat(checkout_id, owner, self.lease_seconds):
                        return

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
