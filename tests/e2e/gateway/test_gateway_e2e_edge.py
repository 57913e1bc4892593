"""The PSP webhook through the gateway, the trace id of every answer, health and OpenAPI."""
import hashlib
import hmac
import json
import time
import uuid

import pytest

from gateway.descriptors import load_routes


@pytest.fixture
def signature(stack):
    """signature(body, secret=<the stack's webhook secret>, t=now) -> a Cuty-Signature header value."""
    def sign(body: bytes, secret: str | None = None, t: int | None = None) -> str:
        return _signature(body, secret or stack.env["CUTY_PSP_WEBHOOK_SECRET"], t)
    return sign


def _signature(body: bytes, secret: str, t: int | None = None) -> str:
    t = int(time.time()) if t is None else t
    return f"t={t},v1=" + hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def event(intent_id: str = "pi_unknown") -> bytes:
    return json.dumps({"id": f"evt_{uuid.uuid4().hex}", "object": "event", "type": "payment_intent.succeeded",
                       "created": int(time.time()), "data": {"object": {"id": intent_id, "object": "payment_intent"}},
                       "request": {"idempotency_key": None}}).encode()


@pytest.mark.parametrize("header", [None, "t=1,v1=00", "garbage", "FORGED"])
async def test_webhook_without_a_valid_signature_is_401(http, signature, header):
    body = event()
    if header == "FORGED":
        header = signature(body, secret="whsec_not_ours")
    r = await http.post("/v1/psp/webhooks", content=body, headers={} if header is None else {"Cuty-Signature": header})
    assert r.status_code == 401, r.text
    assert r.headers["content-type"] == "application/problem+json"


async def test_webhook_stale_signature_is_401(http, signature):
    body = event()
    r = await http.post("/v1/psp/webhooks", content=body, headers={"Cuty-Signature": signature(body, t=int(time.time()) - 3600)})
    assert r.status_code == 401


async def test_signed_webhook_passes_raw_bytes(http, signature):
    # Odd spacing and key order: only the exact bytes verify, so the gateway must not re-encode.
    body = event().replace(b'", "', b'",   "')
    r = await http.post("/v1/psp/webhooks", content=body, headers={"Cuty-Signature": signature(body)})
    assert r.status_code == 200, r.text
    assert r.json()["result"] in ("ignored", "stored", "processed")  # an unknown payment: acknowledged
    dup = await http.post("/v1/psp/webhooks", content=body, headers={"Cuty-Signature": signature(body)})
    assert dup.status_code == 200 and dup.json()["result"] == "duplicate"


async def test_signed_malformed_webhook_is_400(http, signature):
    body = b'{"id": "evt_x", "type": '
    r = await http.post("/v1/psp/webhooks", content=body, headers={"Cuty-Signature": signature(body)})
    assert r.status_code == 400, r.text


async def test_trace_id_header_and_propagation(http, auth, fresh_key, new_product, until_state):
    trace_id = uuid.uuid4().hex
    parent = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"
    r = await http.get("/healthz", headers={"traceparent": parent})
    assert r.headers["x-trace-id"] == trace_id and r.headers["traceparent"].split("-")[1] == trace_id
    fresh = await http.get("/v1/nothing")
    assert len(fresh.headers["x-trace-id"]) == 32 and fresh.json()["traceId"] == fresh.headers["x-trace-id"]

    # The trace crosses gateway -> orchestrator: the payment's timeline records our trace id.
    product, _ = await new_product(1)
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"productId": product["id"], "quantity": 1}, headers={**me, **fresh_key()})).json()
    # A client's traceparent is a link of the gateway's trace, not its parent (docs/security.md).
    paid = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                           headers={**me, **fresh_key(), "traceparent": parent})
    ours = paid.headers["x-trace-id"]
    assert len(ours) == 32 and ours != trace_id
    done = await until_state(co["id"], me)
    events = (await http.get(f"/v1/payments/{done['payment']['id']}/events", headers=auth("staff"))).json()["events"]
    assert ours in {e.get("traceId") for e in events}, events


async def test_healthz_reports_each_service(http):
    r = await http.get("/healthz")
    assert r.status_code == 200
    assert r.json()["services"] == {"booking": "SERVING", "codepool": "SERVING", "payments": "SERVING"}


async def test_openapi_lists_every_route(http):
    doc = (await http.get("/openapi.json")).json()
    ops = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert {("POST", "/v1/checkouts"), ("POST", "/v1/checkouts/{checkout_id}:pay"), ("GET", "/v1/salons/{salon_id}/slots"),
            ("POST", "/v1/psp/webhooks"), ("GET", "/v1/payments/{payment_id}/events"),
            ("POST", "/v1/products/{product_id}/codes:import"), ("GET", "/v1/payments:lookup"),
            ("POST", "/v1/payments/{payment_id}:refund")} <= ops
    assert ("GET", "/v1/checkouts") in ops and ("GET", "/v1/salons/{salon_id}/bookings") in ops
    assert ("POST", "/v1/webhookEndpoints") in ops
    assert ("GET", "/v1/salons/{salon_id}/services/{service_id}/availability") in ops  # services and hours
    # Every route annotated in the protos (the gateway's own table), plus /healthz, /readyz and /openapi.json.
    annotated = {(r.http_method.upper(), r.template.openapi_path) for r in load_routes()}
    assert ops == annotated | {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/openapi.json")}
    watch = doc["paths"]["/v1/checkouts/{checkout_id}:watch"]["get"]["responses"]["200"]["content"]
    assert set(watch) == {"text/event-stream"}


async def test_the_psps_own_webhooks_arrive_through_the_gateway(http, auth, fresh_key, new_product, until_state):
    # pm_card_webhook_first: the PSP's signed webhook (sent to the gateway by `make run`'s wiring)
    # reaches the orchestrator before the synchronous answer.
    product, _ = await new_product(1)
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"productId": product["id"], "quantity": 1}, headers={**me, **fresh_key()})).json()
    await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_webhook_first"}, headers={**me, **fresh_key()})
    done = await until_state(co["id"], me)
    assert done["state"].endswith("COMPLETED")

    async def webhook_seen():
        r = await http.get(f"/v1/payments/{done['payment']['id']}/events", headers=auth("staff"))
        return any(e.get("source") == "webhook" for e in r.json()["events"])
    from cutylib.testing.procs import wait_for
    await wait_for(webhook_seen, timeout=15, message="a webhook event in the payment timeline")
