"""Items 2-3: one checkout paid with pm_card_webhook_first is one trace, received over
OTLP from the real exporter of real processes: gateway, payments (API, saga steps), booking and
the PSP call, and the webhook's delivery a trace of its own linked to it, with the cuty.* ids on the spans."""
from __future__ import annotations

import datetime as dt
import uuid

import httpx

from cutylib.demo import _auth
from cutylib.testing.trust import TEST_MERCHANT
from cutylib.testing.procs import wait_for

SERVER, CLIENT = 2, 3  # OTLP Span.SpanKind


async def slot_checkout_paid(c: httpx.AsyncClient, secret: str, me: dict, method: str):
    """Through the gateway: an admin's salon with one slot; `me` checks it out and pays with
    `method`. Returns (slot, the create response, the pay response)."""
    admin = _auth(secret, "obs-admin", "admin", merchant=TEST_MERCHANT)
    salon = (await c.post("/v1/salons", json={"name": "Obs", "timeZone": "Europe/Istanbul"}, headers=admin)).json()
    res = (await c.post(f"/v1/salons/{salon['id']}/resources", json={"name": "Chair"}, headers=admin)).json()
    start = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=3)).replace(minute=0, second=0, microsecond=0)
    slot = (await c.post(f"/v1/salons/{salon['id']}/slots:batchCreate", headers=admin, json={"slots": [{
        "resourceId": res["id"], "startTime": start.isoformat(), "endTime": (start + dt.timedelta(hours=1)).isoformat(),
        "price": {"currencyCode": "TRY", "amountMinor": "75000"}}]})).json()["slots"][0]
    created = await c.post("/v1/checkouts", json={"slotId": slot["id"]},
                           headers={**me, "Idempotency-Key": uuid.uuid4().hex})
    assert created.status_code == 200, created.text
    paid = await c.post(f"/v1/checkouts/{created.json()['id']}:pay", json={"paymentMethod": method},
                        headers={**me, "Idempotency-Key": uuid.uuid4().hex})
    assert paid.status_code == 200, paid.text
    return slot, created, paid


async def buy_slot(observed, method: str) -> tuple[dict, dict]:
    """A salon, a slot and one checkout of it paid with `method`, through the gateway: (created, done)."""
    me = _auth(observed.secret, f"obs-{uuid.uuid4().hex[:6]}", "customer")
    async with httpx.AsyncClient(base_url=observed.stack.gateway_url, timeout=30) as c:
        _, created, paid = await slot_checkout_paid(c, observed.secret, me, method)
        co = created.json()

        async def completed():
            got = (await c.get(f"/v1/checkouts/{co['id']}", headers=me)).json()
            return got if got["state"].endswith("COMPLETED") else None

        done = await wait_for(completed, timeout=30, interval=0.1, message="the checkout to complete")
    return {**co, "trace_id": created.headers["x-trace-id"], "pay_trace_id": paid.headers["x-trace-id"]}, done


async def test_a_webhook_first_checkout_is_one_trace(observed):
    created, done = await buy_slot(observed, "pm_card_webhook_first")
    trace_id, rx = created["trace_id"], observed.receiver

    def names(service: str) -> set[str]:
        return {s.name for s in rx.in_trace(trace_id) if s.service == service}

    def linked(name: str) -> list:
        """Spans of another trace that link the checkout's: the PSP's webhook delivery starts a
        trace of its own at the gateway (a caller's traceparent is a link there, never the parent)."""
        return [s for s in rx.spans if s.name == name and trace_id in s.links and s.trace_id != trace_id]

    def whole() -> bool:
        return ("checkout.confirm" in names("cuty-payments")
                and linked("POST /v1/psp/webhooks") and linked("payments.webhook")  # each process exports in its own batches
                and any(n.endswith("ConfirmHold") for n in names("cuty-booking"))
                # the saga's drive that the pay request started (exported in a batch of its own)
                and any(created["pay_trace_id"] in s.links for s in rx.in_trace(trace_id) if s.name == "checkout.drive"))

    try:
        await wait_for(whole, timeout=20, message="every span of the checkout's trace to be exported")
    except TimeoutError:
        raise AssertionError({svc: sorted(names(svc)) for svc in ("cuty-gateway", "cuty-payments", "cuty-booking")})
    spans = rx.in_trace(trace_id)
    # gateway: the request that created the checkout
    assert "POST /v1/checkouts" in names("cuty-gateway")
    payments = names("cuty-payments")
    # payments: its API, the saga's steps
    assert {"checkout.hold", "checkout.charge", "checkout.confirm"} <= payments, payments
    assert any(n.endswith("CreateCheckout") for n in payments)
    # booking: the hold and its confirmation
    assert {"HoldSlot", "ConfirmHold"} <= {n.rsplit("/", 1)[-1] for n in names("cuty-booking")}
    # the PSP call is an HTTP client span
    (psp,) = [s for s in spans if s.name == "POST /v1/payment_intents"]
    assert psp.kind == CLIENT and psp.attributes["http.response.status_code"] == 200
    assert psp.attributes["http.request.method"] == "POST" and psp.attributes["server.address"] == "127.0.0.1"
    # the ids an on-call engineer searches by
    attrs = [s.attributes for s in spans]
    assert any(a.get("cuty.checkout.id") == created["id"] for a in attrs)
    assert any(a.get("cuty.payment.id") == done["payment"]["id"] for a in attrs)
    assert any(a.get("cuty.hold.id") == done["holdId"] for a in attrs)
    # the webhook's delivery and handling are one trace of their own, linked to the checkout's: by
    # the gateway from the simulator's traceparent, by payments from the event's payment (a real
    # PSP sends no traceparent)
    (edge,) = linked("POST /v1/psp/webhooks")
    (webhook,) = linked("payments.webhook")
    assert webhook.trace_id == edge.trace_id
    # the pay request is a trace of its own, linked from the saga's drive it started
    assert any(created["pay_trace_id"] in s.links for s in spans if s.name == "checkout.drive")


async def test_an_idle_stack_exports_no_traces_of_its_own(observed):
    """Sweepers, pollers, LISTEN loops, metric refreshes and health checks start no trace."""
    import asyncio

    async def settled():  # the earlier tests' spans (exported in batches) have all arrived
        n = len(observed.receiver.spans)
        await asyncio.sleep(0.5)
        return len(observed.receiver.spans) == n or None
    await wait_for(settled, timeout=15, message="the earlier spans to be exported")
    before = len(observed.receiver.spans)
    async with httpx.AsyncClient(base_url=observed.stack.gateway_url, timeout=10) as c:
        for _ in range(3):
            assert (await c.get("/healthz")).status_code == 200
    # Several rounds of every background loop (poll 1 s, sweep 1 s, refresh 0.5 s) and an export.
    await asyncio.sleep(3)
    late = observed.receiver.spans[before:]
    assert late == [], sorted({(s.service, s.name) for s in late})
