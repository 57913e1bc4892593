"""Disputes end to end (real processes, the PSP simulator; docs/payments.md, "Disputes"): the PSP
disputes a captured charge and tells payments by signed webhooks; payments records the dispute with
its timeline and merchant events, assembles the evidence from what the platform holds (for codes,
the delivery and the buyer's plaintext reads; for a booking, its confirmation and the policy
accepted), submits it before the deadline, and records the outcome; a lost one is counted."""
import json
import subprocess
import sys

import asyncpg
import httpx

from cutylib.config import with_database
from cutylib.testing.procs import wait_for

from tests.e2e.gateway.conftest import buy_booking, state_of

NOWHERE = "http://127.0.0.1:9/hooks"


async def dispute_of(db, payment_id: str):
    return await db.fetchrow("SELECT * FROM disputes WHERE payment_id = $1::uuid", payment_id)


async def test_a_disputed_code_purchase_is_won_on_the_evidence(http, auth, fresh_key, until_state, new_product, stack):
    admin, staff = auth("admin"), auth("staff")
    hook = await http.post("/v1/webhookEndpoints", json={"url": NOWHERE, "events": ["payment.disputed",
                                                                                    "payment.dispute_closed"]},
                           headers=admin)
    assert hook.status_code == 200, hook.text
    product, _ = await new_product(2)
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"productId": product["id"], "quantity": 1},
                          headers={**me, **fresh_key()})).json()
    paid = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_disputed"},
                           headers={**me, **fresh_key()})
    assert paid.status_code == 200, paid.text
    done = await until_state(co["id"], me)
    assert state_of(done) == "COMPLETED" and done["codes"]  # the buyer read the code: a plaintext read
    payment = done["payment"]["id"]
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        async def closed():
            d = await dispute_of(db, payment)
            return d is not None and d["status"] in ("won", "lost")
        await wait_for(closed, timeout=40, interval=0.3, message="the dispute recorded, answered and closed")
        d = await dispute_of(db, payment)
    finally:
        await db.close()
    assert d["status"] == "won" and d["evidence_submitted_at"] <= d["closed_at"]
    doc = json.loads(d["evidence"])
    assert doc["schema"] == "cuty.chargeback-evidence/1" and doc["order"]["id"] == co["id"]
    (code,) = doc["codes"]["codes"]  # the code pool's part: the code, masked, with its deliveries and reads
    assert code["id"] == done["codes"][0]["id"] and done["codes"][0]["value"] not in json.dumps(doc)
    assert [x["status"] for x in code["deliveries"]] == ["delivered"]
    assert any(r["action"] == "read_delivered" for r in code["reads"])  # the buyer's plaintext read, with its time
    events = (await http.get(f"/v1/payments/{payment}/events", headers=staff)).json()["events"]
    assert [e["toStatus"] for e in events if e["source"] == "dispute"] == [
        "dispute.needs_response", "dispute.under_review", "dispute.won"]

    async def told() -> bool:
        log = (await http.get(f"/v1/webhookEndpoints/{hook.json()['id']}/deliveries", headers=admin)).json()
        return {"payment.disputed", "payment.dispute_closed"} <= {x["eventType"] for x in log["deliveries"]}
    await wait_for(told, timeout=20, interval=0.3, message="the dispute's merchant events")


async def test_a_lost_booking_dispute_is_recorded_and_counted(http, auth, fresh_key, until_state, new_slots, stack):
    slot = (await new_slots(1, days_ahead=4))[0]
    me = auth("customer")
    done = await buy_booking(http, me, fresh_key, until_state, slot["id"])
    payment = done["payment"]["id"]
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        intent = await db.fetchval("SELECT psp_intent_id FROM payments WHERE id = $1::uuid", payment)
        async with httpx.AsyncClient(base_url=stack.env["CUTY_PSP_URL"], timeout=10) as psp:
            opened = await psp.post("/v1/_disputes", json={"payment_intent": intent, "reason": "fraudulent",
                                                           "outcome": "lost"})
            assert opened.status_code == 200, opened.text

        async def closed():
            d = await dispute_of(db, payment)
            return d is not None and d["status"] == "lost"
        await wait_for(closed, timeout=40, interval=0.3, message="the dispute lost")
        d = await dispute_of(db, payment)
    finally:
        await db.close()
    booking = json.loads(d["evidence"])["booking"]
    assert booking["slot_id"] == slot["id"] and booking["confirmed_at"]
    assert booking["cancellation_policy_accepted"]["free_cancellation_hours"] is not None
    assert d["reason"] == "fraudulent" and d["amount_minor"] == 75000
    metrics = httpx.get(f"http://127.0.0.1:{stack.env['CUTY_PAYMENTS_METRICS_PORT']}/metrics", timeout=10).text
    assert 'cuty_payments_disputes_total{status="lost"}' in metrics
    # the operator's story of the payment shows the lost dispute and its evidence
    told = subprocess.run([sys.executable, "-m", "payments", "ops", "story", payment], capture_output=True, text=True,
                          timeout=60, env={**stack.env, "CUTY_PAYMENTS_DATABASE_URL": with_database(
                              stack.state()["database_url"], "cuty_payments")})
    assert told.returncode == 0, told.stderr
    assert f"DISPUTE {d['psp_dispute_id']}: LOST 75000 TRY" in told.stdout and "evidence submitted" in told.stdout
