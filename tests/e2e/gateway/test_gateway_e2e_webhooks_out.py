"""End to end: through the gateway an admin registers a webhook endpoint pointing
at a local receiver, a customer's purchase completes, and the receiver gets a `checkout.completed`
signed with the endpoint's secret; the delivery log shows it, and a manual redelivery sends the
same event again (the receiver deduplicates it by its id)."""
from __future__ import annotations

from cutylib.testing.procs import wait_for
from payments import signature
from tests.e2e.gateway.conftest import make_token
from webhook_receiver import Receiver


async def test_an_admins_endpoint_receives_a_verified_checkout_completed(http, auth, fresh_key, new_product,
                                                                          until_state):
    admin = auth("admin")
    async with Receiver() as rx:
        r = await http.post("/v1/webhookEndpoints", json={"url": rx.url, "events": ["checkout.completed"]},
                            headers=admin)
        assert r.status_code == 200, r.text
        endpoint = r.json()
        assert endpoint["secret"].startswith("whsec_") and endpoint["events"] == ["checkout.completed"]
        rx.secrets.append(endpoint["secret"])
        try:
            listed = (await http.get("/v1/webhookEndpoints", headers=admin)).json()["endpoints"]
            mine = [e for e in listed if e["id"] == endpoint["id"]]
            assert mine and not mine[0].get("secret")  # shown once, never again
            bad = await http.post("/v1/webhookEndpoints", json={"url": "http://example.com/x", "events": ["checkout.completed"]},
                                  headers=admin)
            assert bad.status_code == 400 and "url" in bad.text

            product, _ = await new_product(1)
            me = auth("customer")
            co = (await http.post("/v1/checkouts", json={"productId": product["id"], "quantity": 1},
                                  headers={**me, **fresh_key()})).json()
            await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                            headers={**me, **fresh_key()})
            assert (await until_state(co["id"], me))["state"].endswith("COMPLETED")

            def ours(evs):
                return [e for e in evs.values() if e["data"]["checkout"]["id"] == co["id"]]
            await rx.until(lambda evs: len(ours(evs)) == 1, timeout=30)
            (event,) = ours(rx.events)
            assert event["type"] == "checkout.completed" and event["data"]["checkout"]["state"] == "COMPLETED"
            assert event["data"]["checkout"]["product_id"] == product["id"]
            req = next(q for q in rx.requests if q["headers"]["cuty-event-id"] == event["id"])
            signature.verify(req["headers"]["cuty-signature"], req["body"], [endpoint["secret"]])

            async def delivered():
                log = (await http.get(f"/v1/webhookEndpoints/{endpoint['id']}/deliveries", headers=admin)).json()
                return [d for d in log.get("deliveries", []) if d["eventId"] == event["id"] and d["state"] == "delivered"]
            (d,) = await wait_for(delivered, timeout=10, interval=0.1, message="the event delivered")
            assert d["attemptLog"][-1]["httpStatus"] == 204

            again = await http.post(f"/v1/webhookEndpoints/{endpoint['id']}/deliveries/{d['id']}:redeliver", json={},
                                    headers=admin)
            assert again.status_code == 200, again.text
            await wait_for(lambda: rx.duplicates >= 1, timeout=30, message="a redelivered duplicate")
            # another merchant's admin: no such endpoint
            other = {"Authorization": f"Bearer {make_token('admin', org='merchant-elsewhere')}"}
            assert (await http.get(f"/v1/webhookEndpoints/{endpoint['id']}/deliveries", headers=other)).status_code == 404
            assert (await http.delete(f"/v1/webhookEndpoints/{endpoint['id']}", headers=other)).status_code == 404
        finally:
            gone = await http.delete(f"/v1/webhookEndpoints/{endpoint['id']}", headers=admin)
            assert gone.status_code == 200, gone.text

