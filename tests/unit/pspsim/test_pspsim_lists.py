"""The simulator's list API (pspsim/lists.py): captured charges and refunds of a window of times,
disputes changed since an instant, in pages of at most `limit`, each page after `starting_after`;
the balance report of a window per bucket, and the charges of chosen buckets; a bad parameter is a
400 naming it. And the scenario whose dispute webhooks are lost."""
import asyncio
import time

import pytest

from cutylib import digests
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


def report_buckets(report) -> dict[int, digests.Bucket]:
    return {x["bucket"]: digests.Bucket(x["bucket"], x["count"], int(x["fingerprint"], 16)) for x in report["buckets"]}


async def test_a_balance_report_sums_a_window_of_charges_per_bucket(make_psp):
    """The balance report (cutylib.digests): per bucket of the intent id's hash, the count and the
    sum of the charges' fingerprints of (intent, amount, amount refunded), as payments computes its
    own side; a refund moves its charge's fact; a charge outside the window is not in it."""
    psp, _ = await make_psp()
    t0 = time.time()
    made = [await psp.create_intent(f"k{i}", body(amount=100 + i)) for i in range(40)]
    await psp.create_intent("declined", body("pm_card_declined"))  # nothing captured: not reported
    t1 = time.time() + 0.001
    psp.create_refund("r1", {"payment_intent": made[3]["id"], "amount": 50})
    report = lists.balance_report(psp, {"created[gte]": str(t0), "created[lt]": str(t1), "bucket_count": "8"})
    expected: dict[int, list[int]] = {}
    for m in made:
        refunded = 50 if m is made[3] else 0
        s = expected.setdefault(digests.bucket_of(m["id"], 8), [0, 0])
        s[0] += 1
        s[1] += digests.fingerprint_of(m["id"], m["amount"], refunded)
    assert report_buckets(report) == {b: digests.Bucket(b, n, fp % digests.MOD) for b, (n, fp) in expected.items()}
    assert report["count"] == 40 and report["bucket_count"] == 8
    assert report["totals"] == {"TRY": {"count": 40, "amount": sum(100 + i for i in range(40)), "amount_refunded": 50}}
    # a later charge is another window's
    await asyncio.sleep(0.01)
    await psp.create_intent("later", body())
    assert lists.balance_report(psp, {"created[gte]": str(t0), "created[lt]": str(t1), "bucket_count": "8"}) == report
    assert lists.balance_report(psp, {"created[gte]": str(t1), "created[lt]": str(t1 + 60),
                                      "bucket_count": "8"})["count"] == 1


async def test_the_charges_of_chosen_buckets_are_listed(make_psp):
    """The drill-down of a bucket that disagreed: the list API with `bucket_count` and `buckets`
    lists only the charges whose intent falls in those buckets, in pages as without."""
    psp, _ = await make_psp()
    t0 = time.time()
    made = [await psp.create_intent(f"k{i}", body()) for i in range(30)]
    chosen = {digests.bucket_of(made[0]["id"], 16), digests.bucket_of(made[1]["id"], 16)}
    seen, after = [], ""
    for _ in range(40):
        page = lists.charges(psp, {"created[gte]": str(t0), "bucket_count": "16", "limit": "1",
                                   "buckets": ",".join(map(str, sorted(chosen))),
                                   **({"starting_after": after} if after else {})})
        seen += page["data"]
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert [c["payment_intent"] for c in seen] == [m["id"] for m in made if digests.bucket_of(m["id"], 16) in chosen]


@pytest.mark.parametrize("params,field", [
    ({"created[lt]": "10", "bucket_count": "8"}, "created[gte]"),
    ({"created[gte]": "10", "bucket_count": "8"}, "created[lt]"),
    ({"created[gte]": "10", "created[lt]": "10", "bucket_count": "8"}, "created[lt]"),
    ({"created[gte]": "10", "created[lt]": str(10 + lists.MAX_REPORT_SECONDS + 1), "bucket_count": "8"}, "created[lt]"),
    ({"created[gte]": "10", "created[lt]": "20"}, "bucket_count"),
    ({"created[gte]": "10", "created[lt]": "20", "bucket_count": "0"}, "bucket_count"),
    ({"created[gte]": "10", "created[lt]": "20", "bucket_count": str(lists.MAX_REPORT_BUCKETS + 1)}, "bucket_count"),
    ({"created[gte]": "10", "created[lt]": "20", "bucket_count": "8", "limit": "5"}, "limit")])
async def test_a_bad_balance_report_request_is_refused_naming_it(make_psp, params, field):
    psp, _ = await make_psp()
    with pytest.raises(ApiError) as e:
        lists.balance_report(psp, params)
    assert e.value.status == 400 and e.value.error.get("param") == field


@pytest.mark.parametrize("params,field", [
    ({"buckets": "1"}, "bucket_count"), ({"bucket_count": "8"}, "buckets"),
    ({"bucket_count": "8", "buckets": "8"}, "buckets"),
    ({"bucket_count": "8", "buckets": "1,x"}, "buckets"), ({"bucket_count": "x", "buckets": "1"}, "bucket_count"),
    ({"bucket_count": "8", "buckets": "9" * 5000}, "buckets"), ({"bucket_count": "9" * 5000, "buckets": "1"}, "bucket_count"),
    ({"bucket_count": "2048", "buckets": ",".join(map(str, range(lists.MAX_FILTER_BUCKETS + 1)))}, "buckets")])
async def test_a_bad_bucket_filter_is_refused_naming_it(make_psp, params, field):
    psp, _ = await make_psp()
    with pytest.raises(ApiError) as e:
        lists.charges(psp, params)
    assert e.value.status == 400 and e.value.error.get("param") == field
