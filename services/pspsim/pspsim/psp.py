"""The simulated PSP's operations: payment intents, 3DS, cancel, refunds, faults."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from .disputes import Disputes
from .scenarios import AUTHENTICATION_ERROR, DECLINE_ERROR, OFF_SESSION_DECLINE_ERROR, Scenario, scenario_of
from .settings import Settings
from .state import (
    CANCELED, FAILED, PROCESSING, REQUIRES_ACTION, SUCCEEDED,
    Intent, Refund, Store, fingerprint, new_id,
)
from .validation import (
    OFF_SESSION, ApiError, check_fields, invalid, require_key, require_payment_method, validate_intent, validate_refund,
)
from .webhooks import Event, WebhookDispatcher

log = logging.getLogger("pspsim.psp")

FAULT_OPERATIONS = ("create", "retrieve", "cancel", "refund")


class Psp:
    def __init__(self, settings: Settings, webhooks: WebhookDispatcher | None = None):
        self.settings = settings
        self.store = Store()
        self.webhooks = webhooks or WebhookDispatcher(settings)
        self._timers: set[asyncio.Task[None]] = set()
        self.disputes = Disputes(self)

    async def start(self) -> None:
        await self.webhooks.start()

    async def aclose(self) -> None:
        self._cancel_timers()
        await self.webhooks.aclose()

    def reset(self) -> None:
        self._cancel_timers()
        self.webhooks.reset()
        self.store.reset()
        self.disputes.reset()

    def _cancel_timers(self) -> None:
        for t in list(self._timers):
            t.cancel()

    # -- helpers -------------------------------------------------------------------------
    def _fault(self, operation: str) -> None:
        if self.store.take_fault(operation):
            raise ApiError(503, "api_error", "service_unavailable", f"injected fault: {operation} unavailable")

    def _intent(self, intent_id: str) -> Intent:
        intent = self.store.intents.get(intent_id)
        if intent is None:
            raise ApiError(404, "invalid_request_error", "resource_missing",
                           f"no such payment_intent: {intent_id!r}", param="id")
        return intent

    def _copies(self, scenario: Scenario) -> int:
        if not scenario.sends_webhooks:
            return 0
        return self.settings.webhook_duplicate_copies if scenario.duplicates else 1

    def _emit(self, intent: Intent, *events: Event) -> None:
        scenario = scenario_of(intent.payment_method)
        self.webhooks.schedule(list(events), copies=self._copies(scenario), scrambled=scenario.duplicates)

    def _event(self, intent: Intent, type_: str, obj: dict[str, Any] | None = None,
               created: int | None = None) -> Event | None:
        """Build an event for ``intent``, or None if its scenario never sends webhooks."""
        if self._copies(scenario_of(intent.payment_method)) <= 0:
            return None
        obj = intent.snapshot() if obj is None else obj
        return self.webhooks.event(type_, obj, idempotency_key=intent.idempotency_key, created=created,
                                   traceparent=intent.traceparent)

    def _emit_intent(self, intent: Intent, type_: str) -> None:
        event = self._event(intent, type_)
        if event is not None:
            self._emit(intent, event)

    def _unexpected_state(self, intent: Intent, action: str) -> ApiError:
        return ApiError(409, "invalid_request_error", "payment_intent_unexpected_state",
                        f"cannot {action} a payment_intent whose status is {intent.status}",
                        payment_intent=intent.snapshot())

    def _captured(self, intent: Intent) -> None:
        log.info("charge captured", extra={"intent_id": intent.id, "amount": intent.amount,
                                           "currency": intent.currency})

    def _replay(self, kind: str, key: str, fp: str, objects: dict) -> dict[str, Any] | None:
        """The first answer for an Idempotency-Key already used, or None for a new key; the same
        key with other parameters is refused (422), as Stripe does."""
        record = self.store.lookup_key(kind, key)
        if record is None:
            return None
        if record.fingerprint != fp:
            raise ApiError(422, "idempotency_error", "idempotency_key_reused",
                           "this Idempotency-Key was used with different parameters")
        return objects[record.object_id].snapshot()

    # -- payment intents -----------------------------------------------------------------
    async def create_intent(self, key: str | None, body: dict[str, Any], traceparent: str | None = None) -> dict[str, Any]:
        key = require_key(key)
        params = validate_intent(body)
        self._fault("create")
        fp = fingerprint(params)
        replay = self._replay("create", key, fp, self.store.intents)
        if replay is not None:
            return replay

        if params.get("off_session"):
            return self._charge_off_session(key, fp, params, traceparent)
        scenario = scenario_of(params["payment_method"])
        intent_id = new_id("pi")
        intent = Intent(
            id=intent_id, amount=params["amount"], currency=params["currency"],
            payment_method=params["payment_method"], metadata=params["metadata"],
            idempotency_key=key, status=PROCESSING,
            client_secret=f"{intent_id}_secret_{secrets.token_urlsafe(16)}", traceparent=traceparent,
            hosted=not params["payment_method"], setup_future_usage=params["setup_future_usage"],
            off_session_consent=None if params.get("off_session_consent") is None else {
                "amount": params["off_session_consent"], "currency": params["currency"], "accepted": False,
                "accepted_at": None},
        )
        self.store.intents[intent_id] = intent
        self.store.remember_key("create", key, fp, intent_id)
        log.info("intent created", extra={"intent_id": intent_id, "payment_method": intent.payment_method,
                                          "status": scenario.initial_status})

        if scenario.initial_status == SUCCEEDED:
            stale = intent.snapshot()  # still "processing": the stale event of scrambled scenarios
            self.store.capture(intent)
            self._captured(intent)
            succeeded = self._event(intent, "payment_intent.succeeded")
            if scenario.webhook_before_answer and succeeded is not None:
                await self.webhooks.deliver_now(succeeded)
            elif scenario.duplicates and succeeded is not None:
                processing = self._event(intent, "payment_intent.processing", stale, created=intent.created)
                self._emit(intent, processing, succeeded)
            elif succeeded is not None:
                self._emit(intent, succeeded)
            if scenario.disputed:
                self.disputes.open_after_capture(intent)
            if scenario.sync_timeout:
                await asyncio.sleep(self.settings.sync_timeout_delay_seconds)
                raise ApiError(504, "api_error", "timeout", "the PSP timed out (the charge may have happened)")
        elif scenario.initial_status == FAILED:
            intent.status = FAILED
            intent.last_payment_error = dict(DECLINE_ERROR)
            self._emit_intent(intent, "payment_intent.payment_failed")
        elif scenario.initial_status == REQUIRES_ACTION:
            intent.status = REQUIRES_ACTION
            # No payment method yet: the hosted page collects one; else the card's 3-D Secure page.
            page = f"/pay/{intent_id}" if not intent.payment_method else f"/3ds/{intent_id}/complete"
            intent.next_action = {"type": "redirect_to_url", "redirect_url": f"{self.settings.base_url}{page}"}
            self._emit_intent(intent, "payment_intent.requires_action")
        else:
            self._emit_intent(intent, "payment_intent.processing")
            if scenario.settles_later:
                task = asyncio.get_running_loop().create_task(self._settle_later(intent))
                self._timers.add(task)
                task.add_done_callback(self._timers.discard)
        return intent.snapshot()

    def _charge_off_session(self, key: str, fp: str, params: dict[str, Any], traceparent: str | None) -> dict[str, Any]:
        """A charge without the customer, on a payment method an earlier intent saved for this
        customer: it succeeds or is declined at once (no 3-D Secure: nobody is there to complete
        it), with its webhook as any intent's."""
        saved = self.store.saved_methods.get(params["payment_method"])
        if saved is None or saved.customer != params["customer"]:
            raise ApiError(404, "invalid_request_error", "resource_missing",
                           f"no such payment_method for customer {params['customer']!r}: "
                           f"{params['payment_method']!r}", param="payment_method")
        intent_id = new_id("pi")
        intent = Intent(id=intent_id, amount=params["amount"], currency=params["currency"],
                        payment_method=saved.id, metadata=params["metadata"], idempotency_key=key,
                        status=PROCESSING, client_secret=f"{intent_id}_secret_{secrets.token_urlsafe(16)}",
                        traceparent=traceparent, customer=saved.customer, off_session=True)
        self.store.intents[intent_id] = intent
        self.store.remember_key("create", key, fp, intent_id)
        if scenario_of(saved.card).declines_off_session:
            intent.status = FAILED
            intent.last_payment_error = dict(OFF_SESSION_DECLINE_ERROR)
            self._emit_intent(intent, "payment_intent.payment_failed")
        else:
            self.store.capture(intent)
            self._captured(intent)
            self._emit_intent(intent, "payment_intent.succeeded")
        log.info("off-session charge", extra={"intent_id": intent_id, "status": intent.status})
        return intent.snapshot()

    async def _settle_later(self, intent: Intent) -> None:
        await asyncio.sleep(self.settings.settle_delay_ms / 1000.0)
        self.settle(intent)

    def settle(self, intent: Intent) -> None:
        """A processing intent's charge goes through (unless it was canceled meanwhile)."""
        if self.store.intents.get(intent.id) is intent and self.store.capture(intent):
            self._captured(intent)
            self._emit_intent(intent, "payment_intent.succeeded")

    def get_intent(self, intent_id: str) -> dict[str, Any]:
        self._fault("retrieve")
        return self._intent(intent_id).snapshot()

    def cancel_intent(self, intent_id: str, body: dict[str, Any]) -> dict[str, Any]:
        check_fields(body, {"cancellation_reason"})
        reason = body.get("cancellation_reason")
        if reason is not None and not isinstance(reason, str):
            raise invalid("parameter_invalid", f"cancellation_reason must be a string, got {reason!r}",
                          "cancellation_reason")
        self._fault("cancel")
        intent = self._intent(intent_id)
        if intent.status == CANCELED:
            return intent.snapshot()
        if intent.status not in (REQUIRES_ACTION, PROCESSING):
            raise self._unexpected_state(intent, "cancel")
        intent.status = CANCELED
        intent.next_action = None
        intent.canceled_at = int(time.time())
        intent.cancellation_reason = reason
        log.info("intent canceled", extra={"intent_id": intent.id})
        self._emit_intent(intent, "payment_intent.canceled")
        return intent.snapshot()

    def complete_action(self, intent_id: str, succeed: bool) -> dict[str, Any]:
        """The customer finished (or failed) the 3DS redirect."""
        intent = self._intent(intent_id)
        if intent.status == REQUIRES_ACTION:
            if succeed:
                self.store.capture(intent)
                self._captured(intent)
                self._emit_intent(intent, "payment_intent.succeeded")
            else:
                intent.status = FAILED
                intent.next_action = None
                intent.last_payment_error = dict(AUTHENTICATION_ERROR)
                self._emit_intent(intent, "payment_intent.payment_failed")
            return intent.snapshot()
        if intent.status == (SUCCEEDED if succeed else FAILED):
            return intent.snapshot()  # the same redirect visited again
        raise self._unexpected_state(intent, "complete the action of")

    def hosted_intent(self, intent_id: str) -> Intent:
        """The intent behind a hosted payment page (404 for an intent created with a card)."""
        intent = self._intent(intent_id)
        if not intent.hosted:
            raise ApiError(404, "invalid_request_error", "resource_missing",
                           f"payment_intent {intent_id!r} has no hosted payment page", param="id")
        return intent

    async def pay_on_page(self, intent_id: str, payment_method: Any, accept_amount: int | None = None) -> dict[str, Any]:
        """The customer presents a card on the hosted page of an intent created without one (a
        payment link): the card's scenario then runs as if it had come with the create. Visiting
        again with the same card (and the same answer to the page's consent) answers the intent as
        it is; an intent paid, failed or canceled (the link expired) cannot be paid again (409).

        `accept_amount`: the customer consents to the later off-session charge the page asks about
        (`off_session_consent`), naming exactly its amount; another amount, or a consent the page
        does not ask for, is refused (409 `off_session_consent_changed`) and changes nothing. Only
        then is the card saved (setup_future_usage), and the consent recorded with its time."""
        payment_method = require_payment_method(payment_method)
        intent = self.hosted_intent(intent_id)
        consent = intent.off_session_consent
        if intent.payment_method:
            accepted = consent["amount"] if consent and consent["accepted"] else None
            if intent.payment_method == payment_method and accepted == accept_amount:
                return intent.snapshot()
            raise ApiError(409, "invalid_request_error", "payment_intent_unexpected_state",
                           "this payment_intent already has a payment method"
                           + (" and the customer's answer to its consent" if consent else ""),
                           payment_intent=intent.snapshot())
        if intent.status != REQUIRES_ACTION:
            raise self._unexpected_state(intent, "pay on the hosted page")
        if accept_amount is not None and (consent is None or accept_amount != consent["amount"]):
            asked = f"{consent['amount']} {consent['currency']}" if consent else "none"
            raise ApiError(409, "invalid_request_error", "off_session_consent_changed",
                           f"the page asks consent to an off-session charge of {asked}, not {accept_amount}: "
                           "read the page again and accept what it names", param="accept_off_session_amount")
        if accept_amount is not None:
            consent.update(accepted=True, accepted_at=int(time.time()))
            intent.setup_future_usage = OFF_SESSION  # the capture saves the card for that charge
        intent.payment_method = payment_method
        intent.next_action = None
        scenario = scenario_of(payment_method)
        log.info("card presented on the hosted page", extra={"intent_id": intent.id, "payment_method": payment_method})
        if scenario.initial_status == SUCCEEDED:
            self.store.capture(intent)
            self._captured(intent)
            self._emit_intent(intent, "payment_intent.succeeded")
        elif scenario.initial_status == FAILED:
            intent.status = FAILED
            intent.last_payment_error = dict(DECLINE_ERROR)
            self._emit_intent(intent, "payment_intent.payment_failed")
        elif scenario.initial_status == REQUIRES_ACTION:
            intent.next_action = {"type": "redirect_to_url",
                                  "redirect_url": f"{self.settings.base_url}/3ds/{intent.id}/complete"}
        else:
            intent.status = PROCESSING
            self._emit_intent(intent, "payment_intent.processing")
            task = asyncio.get_running_loop().create_task(self._settle_later(intent))
            self._timers.add(task)
            task.add_done_callback(self._timers.discard)
        return intent.snapshot()

    # -- refunds -------------------------------------------------------------------------
    def create_refund(self, key: str | None, body: dict[str, Any]) -> dict[str, Any]:
        key = require_key(key)
        params = validate_refund(body)
        self._fault("refund")
        fp = fingerprint(params)
        replay = self._replay("refund", key, fp, self.store.refunds)
        if replay is not None:
            return replay

        intent = self.store.intents.get(params["payment_intent"])
        if intent is None:
            raise ApiError(404, "invalid_request_error", "resource_missing",
                           f"no such payment_intent: {params['payment_intent']!r}", param="payment_intent")
        if intent.status != SUCCEEDED:
            raise ApiError(400, "invalid_request_error", "payment_intent_unexpected_state",
                           f"cannot refund a payment_intent whose status is {intent.status}",
                           param="payment_intent", payment_intent=intent.snapshot())
        remaining = intent.amount - intent.amount_refunded
        if remaining <= 0:
            raise invalid("charge_already_refunded", "the charge is already fully refunded", "payment_intent")
        amount = remaining if params["amount"] is None else params["amount"]
        if amount > remaining:
            raise invalid("amount_too_large", f"amount must be at most the refundable {remaining}, got {amount}", "amount")

        refund = Refund(id=new_id("re"), payment_intent=intent.id, amount=amount, currency=intent.currency,
                        idempotency_key=key, metadata=params["metadata"], reason=params["reason"])
        self.store.add_refund(intent, refund)
        self.store.remember_key("refund", key, fp, refund.id)
        log.info("refund created", extra={"refund_id": refund.id, "intent_id": intent.id, "amount": amount})
        event = self._event(intent, "charge.refunded", refund.snapshot())
        if event is not None:
            self._emit(intent, event)
        return refund.snapshot()

    def get_refund(self, refund_id: str) -> dict[str, Any]:
        refund = self.store.refunds.get(refund_id)
        if refund is None:
            raise ApiError(404, "invalid_request_error", "resource_missing",
                           f"no such refund: {refund_id!r}", param="id")
        return refund.snapshot()

    # -- test controls -------------------------------------------------------------------
    def faults(self) -> dict[str, int]:
        return {f"fail_next_{op}s": self.store.faults[op] for op in FAULT_OPERATIONS}

    def set_faults(self, body: dict[str, Any]) -> dict[str, int]:
        names = {f"fail_next_{op}s": op for op in FAULT_OPERATIONS}
        check_fields(body, set(names))
        for name, value in body.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid("parameter_invalid_integer", f"{name} must be a non-negative integer, got {value!r}", name)
            self.store.faults[names[name]] = value
        return self.faults()
