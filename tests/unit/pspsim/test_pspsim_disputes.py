"""Disputes in the simulated PSP (pspsim/disputes.py): opened on a captured charge (admin route or the
pm_card_disputed scenario), `charge.dispute.created` then `charge.dispute.closed`, signed like every
webhook; won on evidence, lost without it by the deadline."""
import pytest

from pspsim import signing
from pspsim.validation import ApiError


def body(pm="pm_card_ok", amount=1000):
    return {"amount": amount, "currency": "TRY", "payment_method": pm, "metadata": {"payment_id": "p1"}}


def dispute_events(hook):
    return [d["event"] for d in hook.deliveries if d["event"]["type"].startswith("charge.dispute.")]


async def test_evidence_in_time_wins_the_dispute(make_psp, wait_for):
    psp, hook = await make_psp(dispute_decide_ms=10)
    intent = await psp.create_intent("k1", body())
    d = psp.disputes.open({"payment_intent": intent["id"], "amount": 600})
    assert d["status"] == "needs_response" and d["amount"] == 600 and d["evidence_details"]["due_by"] > 0
    await wait_for(lambda: len(dispute_events(hook)) == 1, what="charge.dispute.created")
    created = dispute_events(hook)[0]
    assert created["type"] == "charge.dispute.created" and created["data"]["object"]["id"] == d["id"]
    assert created["data"]["object"]["payment_intent"] == intent["id"]
    assert all(signing.verify(x["signature"], x["body"], psp.settings.webhook_secrets) for x in hook.deliveries)
    submitted = psp.disputes.submit(d["id"], {"evidence": {"service_date": "2026-12-01"}})
    assert submitted["status"] == "under_review"
    assert psp.disputes.submit(d["id"], {"evidence": {"service_date": "2026-12-01"}})["status"] in (
        "under_review", "won")  # the same submission again: a retry
    await wait_for(lambda: len(dispute_events(hook)) == 2, what="charge.dispute.closed")
    closed = dispute_events(hook)[1]["data"]["object"]
    assert closed["status"] == "won" and closed["evidence"] == {"service_date": "2026-12-01"}
    with pytest.raises(ApiError) as e:
        psp.disputes.submit(d["id"], {"evidence": {"other": "x"}})
    assert e.value.error["code"] == "dispute_not_open"


async def test_no_evidence_by_the_deadline_loses_it(make_psp, wait_for):
    psp, hook = await make_psp()
    intent = await psp.create_intent("k2", body())
    d = psp.disputes.open({"payment_intent": intent["id"], "due_in_seconds": 0.05})
    await wait_for(lambda: len(dispute_events(hook)) == 2, what="the dispute closed by its deadline")
    assert dispute_events(hook)[1]["data"]["object"]["status"] == "lost"
    (row,) = [x for x in psp.disputes.ledger() if x["dispute_id"] == d["id"]]
    assert row["status"] == "lost" and not row["evidence_submitted"]


async def test_the_disputed_scenario_opens_one_after_the_capture(make_psp, wait_for):
    psp, hook = await make_psp(dispute_delay_ms=5)
    intent = await psp.create_intent("k3", body("pm_card_disputed"))
    assert intent["status"] == "succeeded"
    await wait_for(lambda: dispute_events(hook), what="the scenario's dispute")
    assert dispute_events(hook)[0]["data"]["object"]["amount"] == 1000


async def test_only_a_captured_charge_is_disputed_and_bad_input_names_its_param(make_psp):
    psp, _ = await make_psp()
    pending = await psp.create_intent("k4", body("pm_card_3ds"))
    with pytest.raises(ApiError) as e:
        psp.disputes.open({"payment_intent": pending["id"]})
    assert e.value.error["code"] == "payment_intent_unexpected_state"
    ok = await psp.create_intent("k5", body())
    for bad, param in (({"amount": 5000}, "amount"), ({"reason": "x"}, "reason"), ({"outcome": "maybe"}, "outcome"),
                       ({"due_in_seconds": -1}, "due_in_seconds")):
        with pytest.raises(ApiError) as e:
            psp.disputes.open({"payment_intent": ok["id"], **bad})
        assert e.value.error["param"] == param
    d = psp.disputes.open({"payment_intent": ok["id"], "outcome": "lost"})
    with pytest.raises(ApiError):
        psp.disputes.submit(d["id"], {"evidence": {}})
    assert psp.disputes.close(d["id"], {"status": "lost"})["status"] == "lost"
