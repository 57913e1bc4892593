"""The test payment methods: each one picks how the simulated PSP behaves."""

from __future__ import annotations

from dataclasses import dataclass

from .state import FAILED, PROCESSING, REQUIRES_ACTION, SUCCEEDED


@dataclass(frozen=True)
class Scenario:
    name: str
    # Status of the intent in the synchronous answer.
    initial_status: str
    # False: no webhook is ever sent for intents of this method.
    sends_webhooks: bool = True
    # Every event delivered settings.webhook_duplicate_copies times, shuffled, and a stale
    # "processing" event delivered after a copy of "succeeded".
    duplicates: bool = False
    # Deliver the succeeded webhook (first attempt awaited) before the sync answer.
    webhook_before_answer: bool = False
    # Charge, then hang for sync_timeout_delay_seconds and answer 504.
    sync_timeout: bool = False
    # processing -> succeeded after settle_delay_ms.
    settles_later: bool = False
    # The captured charge is disputed after dispute_delay_ms (pspsim/disputes.py).
    disputed: bool = False
    # False: the dispute's webhooks are lost (never sent); only the list API tells of it.
    dispute_webhooks: bool = True
    # Saved for off-session use (setup_future_usage), its later off-session charges are declined
    # (as a card reported lost or emptied since the purchase).
    declines_off_session: bool = False


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("pm_card_ok", SUCCEEDED),
        Scenario("pm_card_declined", FAILED),
        Scenario("pm_card_3ds", REQUIRES_ACTION),
        Scenario("pm_card_webhook_first", SUCCEEDED, webhook_before_answer=True),
        Scenario("pm_card_duplicate_webhooks", SUCCEEDED, duplicates=True),
        Scenario("pm_card_no_webhook", PROCESSING, sends_webhooks=False, settles_later=True),
        Scenario("pm_card_sync_timeout", SUCCEEDED, sync_timeout=True),
        Scenario("pm_card_disputed", SUCCEEDED, disputed=True),
        Scenario("pm_card_disputed_webhook_lost", SUCCEEDED, disputed=True, dispute_webhooks=False),
        Scenario("pm_card_off_session_declined", SUCCEEDED, declines_off_session=True),
    )
}

DECLINE_ERROR = {
    "type": "card_error",
    "code": "card_declined",
    "decline_code": "generic_decline",
    "message": "Your card was declined.",
}

OFF_SESSION_DECLINE_ERROR = {
    "type": "card_error",
    "code": "card_declined",
    "decline_code": "insufficient_funds",
    "message": "The saved card was declined for an off-session charge.",
}

AUTHENTICATION_ERROR = {
    "type": "card_error",
    "code": "payment_intent_authentication_failure",
    "message": "The customer failed 3D Secure authentication.",
}

# An intent created without a payment method, to collect one on the PSP's hosted page (a payment
# link): it waits in requires_action with the page as its redirect URL, and sends its webhooks as a
# plain card does; once the customer presents a card, that card's scenario applies.
HOSTED_PAGE = Scenario("", REQUIRES_ACTION)


def scenario_of(payment_method: str) -> Scenario:
    return SCENARIOS.get(payment_method, HOSTED_PAGE)
