"""The simulator's list API (pspsim/lists.py): captured charges and refunds of a window of times,
disputes changed since an instant, in pages of at most `limit`, each page after `starting_after`;
a bad parameter is a 400 naming it. And the scenario whose dispute webhooks are lost."""
import time

import pytest

from pspsim import lists
from pspsim.validation import ApiError


def body(pm="pm_card_ok", amount=1000):
    return {"amount": amount, "currency": "TRY", "payment_method": pm, "metadata": {"payment_id": "p1"}}


async def test_charges_of_a_window_in_pages(make_psp):
    psp, _ = await make_psp()
    t0 = time.time()
    made = [await psp.create_intent(f"k{i}", body(amount=100 + i)) for i in range(5)]
    await psp.create_intent("declined", body("pm_card_declined"))  # nothing captured: not listed
    t1 = time.time() + 0.001
    seen, after = [], ""
    for _ in range(10):
        page = lists.charges(psp, {"created[gte]": str(t0), "created[lt]": str(t1), "limit": "2",
                                   **({"starting_after": after} if after else {})})
        assert len(page["data"]) <= 2
        seen += page["data"]
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert [c["payment_intent"] for c in seen] == [m["id"] for m in made]
    assert [c["amount"] for c in seen] == [100, 101, 102, 103, 104]
    assert all(t0 <= c["created"] < t1 and c["amount_refunded"] == 0 == c["amount_disputed_lost"] for c in seen)
    # a window after them all is empty
    assert lists.charges(psp, {"created[gte]": str(t1)})["data"] == []


async def test_refunds_are_listed_and_charges_show_them(make_psp):
    psp, _ = await make_psp()
    t0 = time.time()
    intent = await psp.create_intent("k", body(amount=500))
    refund = psp.create_refund("r1", {"payment_intent": intent["id"], "amount": 200})
    (r,) = lists.refunds(psp, {"created[gte]": str(t0)})["data"]
    assert r["id"] == refund["id"] and r["amount"] == 200 and r["payment_intent"] == intent["id"]
    (c,) = lists.charges(psp, {"created[gte]": str(t0)})["data"]
    assert c["amount_refunded"] == 200


async def test_disputes_changed_since_an_instant(make_psp):
    psp, _ = await make_psp()
    intent = await psp.create_intent("k", body())
    t0 = time.time()
    d = psp.disputes.open({"payment_intent": intent["id"]})
    (listed,) = lists.disputes(psp, {"updated[gte]": str(t0)})["data"]
    assert listed["id"] == d["id"] and listed["status"] == "needs_response" and listed["updated"] >= t0
    t1 = time.time()
    assert lists.disputes(psp, {"updated[gte]": str(t1 + 1)})["data"] == []
    psp.disputes.close(d["id"], {"status": "lost"})
    (closed,) = lists.disputes(psp, {"updated[gte]": str(t1)})["data"]
    assert closed["status"] == "lost"
    (c,) = lists.charges(psp, {})["data"]
    assert c["amount_disputed_lost"] == 1000


@pytest.mark.parametrize("params,field", [
    ({"limit": "0"}, "limit"), ({"limit": "1001"}, "limit"), ({"limit": "x"}, "limit"),
    ({"created[gte]": "yesterday"}, "created[gte]"), ({"created[lt]": "-1"}, "created[lt]"),
    ({"created[lt]": "nan"}, "created[lt]"), ({"color": "red"}, "color"),
    ({"starting_after": "ch_nope"}, "starting_after")])
async def test_a_bad_parameter_is_refused_naming_it(make_psp, params, field):
    psp, _ = await make_psp()
    await psp.create_intent("k", body())
    with pytest.raises(ApiError) as e:
        lists.charges(psp, params)
    assert e.value.error.get("param") == field


async def test_the_lost_webhook_scenario_sends_no_dispute_event(make_psp, wait_for):
    psp, hook = await make_psp(dispute_delay_ms=10)
    t0 = time.time()
    intent = await psp.create_intent("k", body("pm_card_disputed_webhook_lost"))
    await wait_for(lambda: lists.disputes(psp, {"updated[gte]": str(t0)})["data"], what="the dispute opened")
    (d,) = lists.disputes(psp, {"updated[gte]": str(t0)})["data"]
    assert d["payment_intent"] == intent["id"]
    # the payment's own webhook came; no charge.dispute.* did
    assert [x["event"]["type"] for x in hook.deliveries if x["event"]["type"].startswith("charge.dispute.")] == []
    assert any(x["event"]["type"] == "payment_intent.succeeded" for x in hook.deliveries)
