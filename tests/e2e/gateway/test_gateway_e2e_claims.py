"""After a code is sold, over HTTP through the gateway (real processes, the PSP simulator; docs/codepool.md,
"Claims, replacement and batch quarantine", docs/payments.md, "Code claims"): a buyer claims a code, the
merchant's admin replaces it (the buyer's checkout shows the new code, never the revoked one), refunds
another (the PSP's ledger refunded one code's price, once) and rejects a third; each step reaches the
payment's timeline and the merchant's events. A batch that collects its product's threshold of claims
stops selling, is released by the admin, and its claims are exported for the supplier."""
import csv
import io
import uuid

import asyncpg
import httpx

from cutylib.config import with_database

from cutylib.testing.procs import wait_for

from tests.e2e.gateway.conftest import state_of

NOWHERE = "http://127.0.0.1:9/hooks"
EVENTS = ["code.claimed", "code.replaced", "code.claim_rejected", "code.claim_refunded", "batch.quarantined"]


async def buy(http, me, fresh_key, until_state, product_id: str, quantity: int) -> dict:
    co = await http.post("/v1/checkouts", json={"productId": product_id, "quantity": quantity},
                         headers={**me, **fresh_key()})
    assert co.status_code == 200, co.text
    paid = await http.post(f"/v1/checkouts/{co.json()['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                           headers={**me, **fresh_key()})
    assert paid.status_code == 200, paid.text
    done = await until_state(co.json()["id"], me)
    assert state_of(done) == "COMPLETED", done
    return done


async def import_batch(http, admin, product_id: str, n: int) -> str:
    r = await http.post(f"/v1/products/{product_id}/codes:import",
                        json={"batchRef": uuid.uuid4().hex, "codes": [f"E2E-{uuid.uuid4().hex[:12]}" for _ in range(n)]},
                        headers=admin)
    assert r.status_code == 200, r.text
    return r.json()["batchId"]


async def test_a_claim_replaced_refunded_and_rejected(http, auth, fresh_key, until_state, new_product, stack):
    admin, staff = auth("admin"), auth("staff")
    hook = await http.post("/v1/webhookEndpoints", json={"url": NOWHERE, "events": EVENTS}, headers=admin)
    assert hook.status_code == 200, hook.text
    product, _ = await new_product(3)
    await import_batch(http, admin, product["id"], 3)
    me = auth("customer")
    done = await buy(http, me, fresh_key, until_state, product["id"], 2)
    a, b = [c["id"] for c in done["codes"]]
    path = f"/v1/checkouts/{done['id']}/codes/{a}:claim"
    body = {"kind": "CLAIM_KIND_DOES_NOT_WORK", "reason": "the shop says the pin is invalid"}

    assert (await http.post(path, json=body, headers=me)).status_code == 400  # an Idempotency-Key is required
    key = fresh_key()
    opened = await http.post(path, json=body, headers={**me, **key})
    assert opened.status_code == 200, opened.text
    claim = opened.json()
    assert claim["status"] == "CLAIM_STATUS_OPEN" and claim["checkoutId"] == done["id"] and claim["codeId"] == a
    assert (await http.post(path, json=body, headers={**me, **key})).json()["id"] == claim["id"]  # a replay
    again = await http.post(path, json=body, headers={**me, **fresh_key()})
    assert again.status_code == 409 and again.json()["type"].endswith("claim-open"), again.text
    stranger = await http.post(path, json=body, headers={**auth("customer"), **fresh_key()})
    assert stranger.status_code == 404, stranger.text

    resolve = f"/v1/claims/{claim['id']}:resolve"
    assert (await http.post(resolve, json={"resolution": "CLAIM_RESOLUTION_REPLACE"},
                            headers={**staff, **fresh_key()})).status_code == 403
    replaced = await http.post(resolve, json={"resolution": "CLAIM_RESOLUTION_REPLACE", "note": "sent a new one"},
                               headers={**admin, **fresh_key()})
    assert replaced.status_code == 200, replaced.text
    new = replaced.json()["replacementCodeId"]
    assert replaced.json()["status"] == "CLAIM_STATUS_REPLACED" and new not in (a, b)
    late = await http.post(resolve, json={"resolution": "CLAIM_RESOLUTION_REJECT", "note": "too late"},
                           headers={**admin, **fresh_key()})
    assert late.status_code == 409 and late.json()["type"].endswith("claim-resolved"), late.text
    mine = await http.get(f"/v1/checkouts/{done['id']}", headers=me)
    assert sorted(c["id"] for c in mine.json()["codes"]) == sorted([b, new])

    # another code refunded: one code's price, through the payment's refunds
    refund_claim = (await http.post(f"/v1/checkouts/{done['id']}/codes/{b}:claim",
                                    json={"kind": "CLAIM_KIND_ALREADY_USED", "reason": "already redeemed"},
                                    headers={**staff, **fresh_key()})).json()
    refunded = await http.post(f"/v1/claims/{refund_claim['id']}:resolve", json={"resolution": "CLAIM_RESOLUTION_REFUND"},
                               headers={**admin, **fresh_key()})
    assert refunded.status_code == 200, refunded.text
    assert refunded.json()["status"] == "CLAIM_STATUS_REFUNDED" and refunded.json()["refund"]["amountMinor"] == "10000"
    mine = await http.get(f"/v1/checkouts/{done['id']}", headers=me)
    assert [c["id"] for c in mine.json()["codes"]] == [new]
    assert mine.json()["payment"]["status"] == "PAYMENT_STATUS_PARTIALLY_REFUNDED"

    # the replacement claimed too, and rejected with a note
    third = (await http.post(f"/v1/checkouts/{done['id']}/codes/{new}:claim", json=body,
                             headers={**me, **fresh_key()})).json()
    no_note = await http.post(f"/v1/claims/{third['id']}:resolve", json={"resolution": "CLAIM_RESOLUTION_REJECT"},
                              headers={**admin, **fresh_key()})
    assert no_note.status_code == 400 and no_note.json()["field"] == "note", no_note.text
    rejected = await http.post(f"/v1/claims/{third['id']}:resolve",
                               json={"resolution": "CLAIM_RESOLUTION_REJECT", "note": "redeemed on our side"},
                               headers={**admin, **fresh_key()})
    assert rejected.json()["status"] == "CLAIM_STATUS_REJECTED", rejected.text
    listed = await http.get("/v1/claims", params={"productId": product["id"]}, headers=staff)
    assert [c["id"] for c in listed.json()["claims"]] == [claim["id"], refund_claim["id"], third["id"]]

    payment = done["payment"]["id"]
    want = {"code.claimed", "code.replaced", "code.claim_refunded", "code.claim_rejected"}

    async def timeline_has_every_step() -> bool:
        events = (await http.get(f"/v1/payments/{payment}/events", headers=staff)).json()["events"]
        return want <= {e["toStatus"] for e in events if e["source"] == "claim"}
    await wait_for(timeline_has_every_step, timeout=30, interval=0.3, message="the claim's steps in the timeline")
    events = (await http.get(f"/v1/payments/{payment}/events", headers=staff)).json()["events"]
    claim_events = [e for e in events if e["source"] == "claim"]
    assert len(claim_events) == 6  # three opened, one replaced, one refunded, one rejected: each once
    assert any(claim["id"] in e["note"] and "replaced by code " + new in e["note"] for e in claim_events)

    async def delivered_to_merchant() -> bool:
        log = (await http.get(f"/v1/webhookEndpoints/{hook.json()['id']}/deliveries", headers=admin)).json()
        return want <= {d["eventType"] for d in log["deliveries"]}
    await wait_for(delivered_to_merchant, timeout=30, interval=0.3, message="the merchant events of the claims")

    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        intent = await db.fetchval("SELECT psp_intent_id FROM payments WHERE id = $1::uuid", payment)
    finally:
        await db.close()
    async with httpx.AsyncClient(base_url=stack.env["CUTY_PSP_URL"], timeout=10) as psp:
        ledger = (await psp.get("/v1/_ledger")).json()
    (charge,) = [c for c in ledger["charges"] if c["intent_id"] == intent]
    assert (charge["amount"], charge["amount_refunded"]) == (20000, 10000)
    assert [r["amount"] for r in ledger["refunds"] if r["intent_id"] == intent] == [10000]


async def test_a_batch_past_its_threshold_stops_selling_until_released(http, auth, fresh_key, until_state, new_product):
    admin, staff = auth("admin"), auth("staff")
    product, _ = await new_product(6)
    set_it = await http.post(f"/v1/products/{product['id']}:setClaimThreshold", json={"claimQuarantineThreshold": 2},
                             headers=admin)
    assert set_it.status_code == 200 and set_it.json()["claimQuarantineThreshold"] == 2, set_it.text
    buyers = [auth("customer") for _ in range(2)]
    bought = [await buy(http, me, fresh_key, until_state, product["id"], 1) for me in buyers]
    for me, co in zip(buyers, bought):
        r = await http.post(f"/v1/checkouts/{co['id']}/codes/{co['codes'][0]['id']}:claim",
                            json={"kind": "CLAIM_KIND_DOES_NOT_WORK", "reason": "invalid pin"},
                            headers={**me, **fresh_key()})
        assert r.status_code == 200, r.text
    (batch,) = (await http.get(f"/v1/products/{product['id']}/batches", headers=staff)).json()["batches"]
    assert batch["status"] == "BATCH_STATUS_QUARANTINED" and batch["countedClaims"] == "2"
    stock = (await http.get(f"/v1/products/{product['id']}/stock", headers=staff)).json()
    assert (stock["available"], stock["quarantined"], stock["delivered"]) == ("0", "4", "2")
    refused = await http.post("/v1/checkouts", json={"productId": product["id"], "quantity": 1},
                              headers={**auth("customer"), **fresh_key()})
    assert refused.status_code == 409 and refused.json()["type"] == "out-of-stock", refused.text
    assert refused.json()["available"] == 0

    export = await http.get(f"/v1/products/{product['id']}/batches/{batch['id']}/claims:export", headers=admin)
    assert export.status_code == 200, export.text
    rows = list(csv.DictReader(io.StringIO(export.json()["csv"])))
    assert sorted(r["order_id"] for r in rows) == sorted(co["id"] for co in bought)
    assert all(r["code"].startswith("E2E-") and r["claim_status"] == "open" and r["opened_at"] for r in rows)
    assert (await http.get(f"/v1/products/{product['id']}/batches/{batch['id']}/claims:export",
                           headers=staff)).status_code == 403

    released = await http.post(f"/v1/products/{product['id']}/batches/{batch['id']}:release",
                               json={"note": "supplier confirmed the batch"}, headers=admin)
    assert released.status_code == 200 and released.json()["codesMoved"] == "4", released.text
    stock = (await http.get(f"/v1/products/{product['id']}/stock", headers=staff)).json()
    assert (stock["available"], stock["quarantined"]) == ("4", "0")
    retire = await http.post(f"/v1/products/{product['id']}/batches/{batch['id']}:retire", json={}, headers=admin)
    assert retire.status_code == 409 and retire.json()["type"].endswith("batch-not-quarantined"), retire.text
