"""The forward-only state machine and the reading of PSP objects: pure, no I/O."""
import itertools
from datetime import datetime, timezone

import pytest

from payments import domain
from payments.domain import Outcome, decide
from payments.views import PaymentView

NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("current, observed, outcome", [
    ("created", "requires_action", Outcome.APPLY),
    ("created", "succeeded", Outcome.APPLY),
    ("requires_action", "processing", Outcome.APPLY),
    ("processing", "succeeded", Outcome.APPLY),
    ("succeeded", "refunded", Outcome.APPLY),
    ("succeeded", "succeeded", Outcome.SAME),
    ("succeeded", "processing", Outcome.STALE),       # the late processing after success
    ("succeeded", "requires_action", Outcome.STALE),
    ("processing", "requires_action", Outcome.STALE),
    ("refunded", "succeeded", Outcome.STALE),
    ("succeeded", "failed", Outcome.CONTRADICTS),
    ("failed", "succeeded", Outcome.CONTRADICTS),
    ("canceled", "succeeded", Outcome.CONTRADICTS),
    ("failed", "refunded", Outcome.CONTRADICTS),
    ("created", "refunded", Outcome.CONTRADICTS),
])
def test_decide(current, observed, outcome):
    assert decide(current, observed) is outcome


def test_only_apply_moves_and_every_apply_is_forward():
    rank = {s: i for i, s in enumerate(domain.STATUSES)}
    for current, observed in itertools.product(domain.STATUSES, domain.STATUSES[1:]):
        out = decide(current, observed)
        assert (out is Outcome.APPLY) == domain.can_transition(current, observed)
        if out is Outcome.APPLY:
            assert current not in domain.TERMINAL - domain.REFUNDABLE
            assert rank[observed] > rank[current] or current == "created"


def test_terminal_statuses_have_no_way_out_except_refund():
    for s in domain.TERMINAL:
        assert domain.TRANSITIONS[s] <= {"partially_refunded", "refunded"}
    # A partly refunded payment may only be refunded further; a late "succeeded" is old news
    assert domain.TRANSITIONS["partially_refunded"] == {"refunded"}
    assert decide("partially_refunded", "succeeded") is Outcome.STALE
    assert decide("partially_refunded", "refunded") is Outcome.APPLY


def test_old_news_is_what_finalize_would_not_write():
    """What a webhook may be acknowledged for without a lease or a write: the payment's own status,
    or one it has moved past; never a contradiction (asked of the PSP) nor a move still possible."""
    assert set(domain.old_news(domain.PROCESSING)) >= {domain.SUCCEEDED, domain.FAILED, domain.REFUNDED}
    assert domain.SUCCEEDED in domain.old_news(domain.SUCCEEDED)
    assert domain.FAILED not in domain.old_news(domain.SUCCEEDED)  # contradicts: the PSP is asked
    assert domain.old_news(domain.REFUNDED) == (domain.REFUNDED,)  # a succeeded payment may still be refunded
    for observed in set(domain.EVENT_STATUS.values()):
        for current in domain.old_news(observed):
            assert decide(current, observed) in (Outcome.SAME, Outcome.STALE)


def test_unknown_statuses_are_refused():
    with pytest.raises(ValueError, match="observed"):
        decide("created", "created")
    with pytest.raises(ValueError, match="observed"):
        decide("created", "captured")
    with pytest.raises(ValueError, match="current"):
        decide("weird", "succeeded")


def test_reading_psp_objects():
    intent = {"id": "pi_1", "object": "payment_intent", "status": "requires_action", "client_secret": "pi_1_secret",
              "next_action": {"type": "redirect_to_url", "redirect_url": "https://psp/3ds/pi_1"}, "amount": 10}
    assert domain.status_of_intent(intent) == "requires_action"
    obs = domain.observation_of(intent)
    assert (obs.psp_intent_id, obs.redirect_url, obs.client_secret) == ("pi_1", "https://psp/3ds/pi_1", "pi_1_secret")
    failed = {**intent, "status": "failed", "next_action": None,
              "last_payment_error": {"code": "card_declined", "message": "declined"}}
    assert domain.observation_of(failed).failure_reason == "card_declined"
    refunded = {**intent, "status": "succeeded", "amount_refunded": 10}
    assert domain.status_of_intent(refunded) == "refunded"
    refund = {"id": "re_1", "object": "refund", "payment_intent": "pi_1"}
    assert domain.observation_of(refund) == domain.Observation(psp_intent_id="pi_1", psp_refund_id="re_1")
    assert domain.observation_of(None) == domain.Observation()
    with pytest.raises(ValueError):
        domain.status_of_intent({"status": "requires_capture"})


def test_intent_body_is_deterministic_for_replays():
    a = domain.intent_body(payment_id="p", checkout_id="c", amount_minor=5, currency="TRY", payment_method="pm")
    assert a == domain.intent_body(payment_id="p", checkout_id="c", amount_minor=5, currency="TRY", payment_method="pm")
    assert a["metadata"] == {"payment_id": "p", "checkout_id": "c"}


@pytest.mark.parametrize("status", domain.STATUSES)
def test_view_carries_the_customer_action_only_while_waiting(status):
    v = PaymentView(id="p", checkout_id=None, customer_id="c", status=status, version=2, amount_minor=1, currency="TRY",
                    psp_intent_id="pi", payment_method="pm", redirect_url="https://r", client_secret="s",
                    failure_reason=None, created_at=NOW, updated_at=NOW)
    proto = v.to_proto()
    if status == "requires_action":
        assert (v.redirect_url, v.client_secret) == ("https://r", "s")
        assert proto.next_action.redirect_url == "https://r" and proto.client_secret == "s"
    else:
        assert (v.redirect_url, v.client_secret) == (None, None)
        assert not proto.HasField("next_action") and proto.client_secret == ""


@pytest.mark.parametrize("bad", ["", "x" * (domain.MAX_PAYMENT_METHOD + 1), "pm_card\nok"])
def test_a_payment_method_is_one_rule_for_the_core_and_the_checkout(bad):
    from cutylib.errors import InvalidArgument
    from payments.checkout import domain as checkout
    assert domain.require_payment_method("pm_card_ok") == "pm_card_ok"
    with pytest.raises(InvalidArgument) as e:
        domain.require_payment_method(bad)
    assert e.value.field == "payment_method"
    with pytest.raises(InvalidArgument):  # a one-call CreateCheckout takes it by the same rule
        checkout.validate_create("", "00000000-0000-0000-0000-000000000001", 1, bad)
