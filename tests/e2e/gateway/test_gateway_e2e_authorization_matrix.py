"""The authorisation matrix, generated from the gateway's route table and run against the
real stack (gateway, services, Postgres, PSP simulator as processes).

Every route x every role x the merchant the caller belongs to (the objects' own merchant, or
another one) has one expected status. Customers and the platform's operator belong to no merchant,
so for them "own" and "other" are the same call. A route served by the gateway without a row here
fails the test, as does a row for a route that no longer exists.
"""
from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass

import asyncpg
import pytest
import pytest_asyncio

from cutylib.config import with_database
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import TEST_MERCHANT
from gateway.descriptors import load_routes

from tests.e2e.gateway.conftest import make_token, state_of

ROLES = ("customer", "staff", "admin", "operator")
OTHER_MERCHANT = "merchant-other-" + uuid.uuid4().hex[:6]
NO_ORG_CHECKED = ("staff", "admin")  # roles whose token must name a merchant
_HOURS = itertools.count(1)
WINDOW = {"startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-08T00:00:00Z"}  # ListSlots' required window  # every new slot of the test an hour later than the last: never a duplicate


def row(ok: int = 200, *, roles: tuple[str, ...], other: int = 404, denied: int = 403, public: int | None = None):
    """Expected statuses of one route: `ok` for an allowed role on its own merchant's object,
    `other` for a merchant-bound role (staff, admin) on another merchant's, `denied` otherwise."""
    out = {}
    for role in ROLES:
        if public is not None:
            out[role] = (public, public)
        elif role not in roles:
            out[role] = (denied, denied)
        elif role in ("staff", "admin"):
            out[role] = (ok, other)
        else:  # no merchant: the same call either way
            out[role] = (ok, ok)
    return out


# (method, template) -> {role: (own merchant, other merchant)}
MATRIX = {
    # An admin creates in their own merchant: there is no "other" object to hit.
    ("POST", "/v1/salons"): row(roles=("admin",), other=200),
    # The salon's merchant's admins; another merchant's salon does not exist for them.
    ("POST", "/v1/salons/{salon_id}:setCancellationPolicy"): row(roles=("admin",)),
    ("POST", "/v1/salons/{salon_id}/resources"): row(roles=("admin",)),
    ("POST", "/v1/salons/{salon_id}/slots:batchCreate"): row(roles=("admin",)),
    # Customers browse every salon; staff and admins only their merchant's; the operator all.
    ("GET", "/v1/salons/{salon_id}/slots"): row(roles=("customer", "staff", "admin", "operator")),
    # A salon's agenda; another merchant's salon does not exist for its staff.
    ("GET", "/v1/salons/{salon_id}/bookings"): row(roles=("staff", "admin")),
    # Services and working hours: the salon's merchant's admins define them; every signed-in user
    # reads services and free times, staff and admins of their own merchant's salons only.
    ("POST", "/v1/salons/{salon_id}/services"): row(roles=("admin",)),
    ("GET", "/v1/salons/{salon_id}/services"): row(roles=("customer", "staff", "admin", "operator")),
    ("POST", "/v1/salons/{salon_id}/resources/{resource_id}:setWorkingHours"): row(roles=("admin",)),
    ("POST", "/v1/salons/{salon_id}:setHoursOverride"): row(roles=("admin",)),
    ("POST", "/v1/salons/{salon_id}:setBookingSettings"): row(roles=("admin",)),
    ("GET", "/v1/salons/{salon_id}/services/{service_id}/availability"): row(
        roles=("customer", "staff", "admin", "operator")),
    ("POST", "/v1/products"): row(roles=("admin",), other=200),
    ("POST", "/v1/products/{product_id}/codes:import"): row(roles=("admin",)),
    ("GET", "/v1/products/{product_id}/stock"): row(roles=("staff", "admin", "operator")),
    ("GET", "/v1/products/{product_id}/codes"): row(roles=("staff", "admin", "operator")),
    ("POST", "/v1/codes/{code_id}:reveal"): row(roles=("admin",)),
    ("POST", "/v1/checkouts"): row(roles=("customer",)),
    # A list is filtered to the caller (a customer's own, a merchant's own): another
    # merchant's staff get 200 and none of this merchant's checkouts
    # (test_another_merchants_list_is_empty_of_ours).
    ("GET", "/v1/checkouts"): row(roles=("customer", "staff", "admin", "operator"), other=200),
    ("POST", "/v1/checkouts/{checkout_id}:pay"): row(roles=("customer",)),
    ("GET", "/v1/checkouts/{checkout_id}"): row(roles=("customer", "staff", "admin", "operator")),
    # The customer cancels their own (a fresh HELD one here); the merchant's staff and
    # admins cancel a completed booking with a full refund: the world's checkout bought codes, so
    # they are refused (409 codes-delivered); another merchant's checkout does not exist for them.
    ("POST", "/v1/checkouts/{checkout_id}:cancel"): {**row(roles=("customer", "staff", "admin")),
                                                     "staff": (409, 404), "admin": (409, 404)},
    # Allowed, then refused by the saga (409 not-a-booking): the world's checkout
    # bought codes; another merchant's checkout does not exist for its staff; the operator is refused.
    ("POST", "/v1/checkouts/{checkout_id}:reschedule"): row(409, roles=("customer", "staff", "admin")),
    # Server-Sent Events; the world's COMPLETED checkout ends its stream after one event.
    ("GET", "/v1/checkouts/{checkout_id}:watch"): row(roles=("customer", "staff", "admin", "operator")),
    # Allowed, and then refused by the saga (409): the checkout does not need attention.
    ("POST", "/v1/checkouts/{checkout_id}:retry"): row(409, roles=("admin", "operator")),
    # Staff book for a customer (a fresh slot of TEST_MERCHANT's, paid at the venue): another
    # merchant's slot does not exist for them. Marking the world's checkout (codes, not paid at the
    # venue) is refused by the service (409); another merchant's checkout does not exist for them.
    ("POST", "/v1/checkouts:createForCustomer"): row(roles=("staff", "admin")),
    ("POST", "/v1/checkouts/{checkout_id}:markPaid"): row(409, roles=("staff", "admin")),
    ("POST", "/v1/checkouts/{checkout_id}:markNoShow"): row(409, roles=("staff", "admin")),
    ("GET", "/v1/payments/{payment_id}/events"): row(roles=("staff", "admin", "operator")),
    ("GET", "/v1/payments:lookup"): row(roles=("staff", "admin", "operator")),
    # The world's payment bought codes that were delivered: staff are refused (409
    # codes-delivered), the merchant's admin refunds 1 minor unit (the amount named); another
    # merchant's payment does not exist for them; the operator reads but does not refund.
    ("POST", "/v1/payments/{payment_id}:refund"): {**row(roles=("staff", "admin")), "staff": (409, 404)},
    # After a code is sold (docs/codepool.md, "Claims"): the buyer claims on their own checkout, the
    # merchant's staff and admins on their merchant's (another merchant's code does not exist for them);
    # each claim the call opens is rejected again by the world's admin, so the next one may open.
    ("POST", "/v1/checkouts/{checkout_id}/codes/{code_id}:claim"): row(roles=("customer", "staff", "admin")),
    ("GET", "/v1/claims/{claim_id}"): row(roles=("customer", "staff", "admin")),
    # A list is filtered to the caller: another merchant's staff get 200 and none of ours.
    ("GET", "/v1/claims"): row(roles=("customer", "staff", "admin"), other=200),
    # The merchant's admin resolves (here: rejects a fresh claim); another merchant's is not found.
    ("POST", "/v1/claims/{claim_id}:resolve"): row(roles=("admin",)),
    ("POST", "/v1/products/{product_id}:setClaimThreshold"): row(roles=("admin",)),
    ("GET", "/v1/products/{product_id}/batches"): row(roles=("staff", "admin")),
    # Allowed, then refused (409 batch-not-quarantined): the world's batch sells.
    ("POST", "/v1/products/{product_id}/batches/{batch_id}:release"): row(409, roles=("admin",)),
    ("POST", "/v1/products/{product_id}/batches/{batch_id}:retire"): row(409, roles=("admin",)),
    ("GET", "/v1/products/{product_id}/batches/{batch_id}/claims:export"): row(roles=("admin",)),
    # No token needed, and a token grants nothing: an unsigned webhook is refused as unsigned.
    ("POST", "/v1/psp/webhooks"): row(roles=(), public=401),
    # Webhook endpoints are a merchant's admins'; an admin creates and lists in
    # their own merchant (no "other" object), another merchant's endpoint does not exist for them.
    ("POST", "/v1/webhookEndpoints"): row(roles=("admin",), other=200),
    ("GET", "/v1/webhookEndpoints"): row(roles=("admin",), other=200),
    ("DELETE", "/v1/webhookEndpoints/{endpoint_id}"): row(roles=("admin",)),
    ("GET", "/v1/webhookEndpoints/{endpoint_id}/deliveries"): row(roles=("admin",)),
    ("POST", "/v1/webhookEndpoints/{endpoint_id}/deliveries/{delivery_id}:redeliver"): row(roles=("admin",)),
}
# Where the matrix's webhook endpoints point: nothing listens (connection refused, retried later).
NOWHERE = "http://127.0.0.1:9/hooks"


def test_every_route_has_a_row_and_every_row_a_route():
    served = {(r.http_method, r.template.source) for r in load_routes()}
    assert served == set(MATRIX), ("routes without a row", served - set(MATRIX), "rows without a route",
                                   set(MATRIX) - served)


@dataclass
class World:
    """Merchant TEST_MERCHANT's objects, made through the public API, and a customer who bought."""
    salon: str
    resource: str
    product: str
    code_id: str
    customer: str
    checkout: str  # COMPLETED, the customer's
    payment: str
    intent: str
    endpoint: str  # a webhook endpoint of TEST_MERCHANT's, subscribed to checkout.completed
    delivery: str  # its delivery of the checkout's checkout.completed
    batch: str     # the product's supplier batch
    claim: str     # a claim of the customer's on the checkout's code (rejected)
    service: str = ""  # a service of the salon, performed by the resource


def headers(role: str, merchant: str, sub: str | None = None, **extra) -> dict[str, str]:
    org = merchant if role in ("staff", "admin") else None
    return {"Authorization": f"Bearer {make_token(role, sub, org=org)}", **extra}


def future_slot(resource: str) -> dict:
    import datetime as dt
    start = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=3, hours=next(_HOURS))).replace(
        minute=0, second=0, microsecond=0)
    return {"resourceId": resource, "startTime": start.isoformat(), "endTime": (start + dt.timedelta(hours=1)).isoformat(),
            "price": {"currencyCode": "TRY", "amountMinor": "75000"}}


@pytest_asyncio.fixture(scope="module")
async def world(http, stack, until_state) -> World:
    admin = headers("admin", TEST_MERCHANT)
    salon = (await http.post("/v1/salons", json={"name": "Matrix", "timeZone": "Europe/Istanbul"}, headers=admin)).json()
    assert salon["merchantId"] == TEST_MERCHANT
    resource = (await http.post(f"/v1/salons/{salon['id']}/resources", json={"name": "chair"}, headers=admin)).json()
    product = (await http.post("/v1/products", json={"sku": f"MX-{uuid.uuid4().hex[:8]}", "name": "Matrix card",
                                                     "price": {"currencyCode": "TRY", "amountMinor": "1000"}},
                               headers=admin)).json()
    r = await http.post(f"/v1/products/{product['id']}/codes:import",
                        json={"batchRef": uuid.uuid4().hex, "codes": [f"MX-{uuid.uuid4().hex}" for _ in range(20)]},
                        headers=admin)
    assert r.status_code == 200, r.text
    batch = r.json()["batchId"]
    endpoint = await http.post("/v1/webhookEndpoints", json={"url": NOWHERE, "events": ["checkout.completed"]},
                               headers=admin)
    assert endpoint.status_code == 200 and endpoint.json()["secret"], endpoint.text
    customer = "matrix-buyer-" + uuid.uuid4().hex[:6]
    me = headers("customer", "", customer)
    created = (await http.post("/v1/checkouts", json={"productId": product["id"], "quantity": 1},
                               headers={**me, "Idempotency-Key": uuid.uuid4().hex})).json()
    paid = await http.post(f"/v1/checkouts/{created['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                           headers={**me, "Idempotency-Key": uuid.uuid4().hex})
    assert paid.status_code == 200, paid.text
    done = await until_state(created["id"], me, {"COMPLETED"})
    db = await asyncpg.connect(with_database(stack.state()["database_url"], "cuty_payments"))
    try:
        intent = await db.fetchval("SELECT psp_intent_id FROM payments WHERE id = $1::uuid", done["payment"]["id"])
    finally:
        await db.close()
    log = (await http.get(f"/v1/webhookEndpoints/{endpoint.json()['id']}/deliveries", headers=admin)).json()
    (delivery,) = [d for d in log["deliveries"] if d["eventType"] == "checkout.completed"]
    service = await http.post(f"/v1/salons/{salon['id']}/services", headers=admin, json={
        "name": "Matrix cut", "durationMinutes": 30, "resourceIds": [resource["id"]],
        "price": {"currencyCode": "TRY", "amountMinor": "1000"}})
    assert service.status_code == 200, service.text
    claim = await open_and_reject(http, created["id"], done["codes"][0]["id"], me)
    return World(salon["id"], resource["id"], product["id"], done["codes"][0]["id"], customer, created["id"],
                 done["payment"]["id"], intent, endpoint.json()["id"], delivery["id"], batch, claim, service.json()["id"])


async def open_claim(http, checkout: str, code: str, h: dict):
    return await http.post(f"/v1/checkouts/{checkout}/codes/{code}:claim",
                           json={"kind": "CLAIM_KIND_DOES_NOT_WORK", "reason": "authorization matrix"},
                           headers={**h, "Idempotency-Key": uuid.uuid4().hex})


async def reject(http, claim: str) -> None:
    r = await http.post(f"/v1/claims/{claim}:resolve", json={"resolution": "CLAIM_RESOLUTION_REJECT", "note": "matrix"},
                        headers={**headers("admin", TEST_MERCHANT), "Idempotency-Key": uuid.uuid4().hex})
    assert r.status_code == 200, r.text


async def open_and_reject(http, checkout: str, code: str, h: dict) -> str:
    """A claim on the world's code, rejected at once, so the code may be claimed again."""
    r = await open_claim(http, checkout, code, h)
    assert r.status_code == 200, r.text
    await reject(http, r.json()["id"])
    return r.json()["id"]


async def held_checkout(http, w: World, customer: str) -> str:
    """A fresh HELD checkout of `customer` (for :pay and :cancel), on a fresh slot."""
    admin = headers("admin", TEST_MERCHANT)
    r = await http.post(f"/v1/salons/{w.salon}/slots:batchCreate", json={"slots": [future_slot(w.resource)]},
                        headers=admin)
    assert r.status_code == 200, r.text
    slot = r.json()["slots"][0]["id"]
    c = await http.post("/v1/checkouts", json={"slotId": slot},
                        headers={**headers("customer", "", customer), "Idempotency-Key": uuid.uuid4().hex})
    assert c.status_code == 200 and state_of(c.json()) == "HELD", c.text
    return c.json()["id"]


async def call(http, w: World, method: str, template: str, role: str, merchant: str) -> int:
    """One request of `role` (of `merchant`, when the role has one) to the route, with a valid body,
    against TEST_MERCHANT's objects (a customer acts on their own purchase)."""
    sub = w.customer if role == "customer" else None
    h = headers(role, merchant, sub)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    ids = {"salon_id": w.salon, "product_id": w.product, "code_id": w.code_id, "checkout_id": w.checkout,
           "payment_id": w.payment, "endpoint_id": w.endpoint, "delivery_id": w.delivery, "batch_id": w.batch,
           "claim_id": w.claim, "resource_id": w.resource, "service_id": w.service}
    body, params = None, None
    if template == "/v1/salons":
        body = {"name": "Another", "timeZone": "Europe/Istanbul"}
    elif template.endswith(":setCancellationPolicy"):
        body = {"freeCancellationHours": 24, "cancellationFeePercent": 0}  # the defaults: the world stays as it is
    elif template.endswith("/resources"):
        body = {"name": "stylist"}
    elif template.endswith("/services") and method == "POST":
        body = {"name": "cut", "durationMinutes": 30, "resourceIds": [w.resource],
                "price": {"currencyCode": "TRY", "amountMinor": "1"}}
    elif template.endswith(":setWorkingHours"):
        body = {"intervals": [{"weekday": 1, "opens": "09:00", "closes": "17:00"}]}
    elif template.endswith(":setHoursOverride"):
        body = {"day": "2030-01-01"}  # neither closed nor hours: no override (nothing changes)
    elif template.endswith(":setBookingSettings"):
        body = {"timeStepMinutes": 15}  # the default: the world stays as it is
    elif template.endswith("/availability"):
        params = {"startDay": "2026-01-01"}
    elif template.endswith("slots:batchCreate"):
        body = {"slots": [future_slot(w.resource)]}
    elif template == "/v1/products":
        body = {"sku": f"MX-{uuid.uuid4().hex[:8]}", "name": "card", "price": {"currencyCode": "TRY", "amountMinor": "1"}}
    elif template.endswith("codes:import"):
        body = {"batchRef": uuid.uuid4().hex, "codes": [f"MX-{uuid.uuid4().hex}"]}
    elif template == "/v1/checkouts" and method == "GET":
        params = {"pageSize": 10}
    elif template == "/v1/checkouts":
        body = {"productId": w.product, "quantity": 1}
        h.update(key)
    elif template.endswith(":pay"):
        ids["checkout_id"] = await held_checkout(http, w, w.customer) if role == "customer" else w.checkout
        body = {"paymentMethod": "pm_card_ok"}
        h.update(key)
    elif template.endswith(":cancel"):
        ids["checkout_id"] = await held_checkout(http, w, w.customer) if role == "customer" else w.checkout
        body = {} if role == "customer" else {"reason": "authorization matrix"}
    elif template.endswith(":reschedule"):
        body = {"slotId": str(uuid.uuid4())}
        h.update(key)
    elif template == "/v1/checkouts:createForCustomer":
        made = await http.post(f"/v1/salons/{w.salon}/slots:batchCreate", json={"slots": [future_slot(w.resource)]},
                               headers=headers("admin", TEST_MERCHANT))
        assert made.status_code == 200, made.text
        body = {"slotId": made.json()["slots"][0]["id"], "customerId": w.customer, "settlement": "SETTLEMENT_AT_VENUE"}
        h.update(key)
    elif template.endswith(":markPaid"):
        body = {"method": "VENUE_PAYMENT_METHOD_CASH", "amount": {"currencyCode": "TRY", "amountMinor": "1"},
                "reference": "matrix"}
    elif template.endswith(":retry") or template.endswith(":reveal") or template.endswith(":markNoShow"):
        body = {}
    elif template.endswith(":refund"):
        body = {"amount": {"currencyCode": "TRY", "amountMinor": "1"}, "reason": "authorization matrix"}
        h.update(key)
    elif template == "/v1/payments:lookup":
        params = {"pspIntentId": w.intent}
    elif template.endswith("/slots"):
        params = WINDOW
    elif template.endswith("/bookings"):
        params = {"day": "2026-01-01"}
    elif template == "/v1/webhookEndpoints" and method == "POST":
        body = {"url": NOWHERE, "events": ["booking.confirmed"]}
    elif template == "/v1/webhookEndpoints/{endpoint_id}" and method == "DELETE":
        # a fresh endpoint of TEST_MERCHANT's each time: the world's one must survive
        made = await http.post("/v1/webhookEndpoints", json={"url": NOWHERE, "events": ["booking.confirmed"]},
                               headers=headers("admin", TEST_MERCHANT))
        assert made.status_code == 200, made.text
        ids["endpoint_id"] = made.json()["id"]
    elif template.endswith(":redeliver"):
        body = {}
    elif template.endswith(":claim"):
        body = {"kind": "CLAIM_KIND_DOES_NOT_WORK", "reason": "authorization matrix"}
        h.update(key)
    elif template.endswith(":resolve"):
        # a fresh claim of the customer's each time, rejected by the caller (or, refused, by the world's admin)
        fresh = await open_claim(http, w.checkout, w.code_id, headers("customer", "", w.customer))
        assert fresh.status_code == 200, fresh.text
        ids["claim_id"] = fresh.json()["id"]
        body = {"resolution": "CLAIM_RESOLUTION_REJECT", "note": "authorization matrix"}
        h.update(key)
    elif template.endswith(":setClaimThreshold") or template.endswith(":release") or template.endswith(":retire"):
        body = {}
    elif template == "/v1/psp/webhooks":
        body = {"id": "evt_matrix", "type": "payment_intent.succeeded"}
    path = template.format(**ids)
    if template.endswith(":watch"):  # a stream: the status of the response head is the answer
        async with http.stream(method, path, headers=h) as r:
            return r.status_code
    r = await http.request(method, path, json=body if method == "POST" else None, params=params, headers=h)
    if template.endswith(":claim") and r.status_code == 200:
        await reject(http, r.json()["id"])
    if template.endswith(":resolve") and r.status_code != 200:
        await reject(http, ids["claim_id"])
    if r.status_code == 409 and template.endswith(":redeliver"):  # an attempt was in flight: ask again
        async def settled() -> bool:
            nonlocal r
            r = await http.request(method, path, json=body, headers=h)
            return r.status_code != 409
        await wait_for(settled, timeout=15, interval=0.2, message="the delivery's attempt in flight to end")
    return r.status_code


async def test_the_authorization_matrix(http, world):
    failures = []
    for (method, template), expected in MATRIX.items():
        for role in ROLES:
            own, other = expected[role]
            got = await call(http, world, method, template, role, TEST_MERCHANT)
            if got != own:
                failures.append((method, template, role, "own", own, got))
            if role in ("staff", "admin"):
                got = await call(http, world, method, template, role, OTHER_MERCHANT)
                if got != other:
                    failures.append((method, template, role, "other", other, got))
    assert not failures, "\n".join(f"{m} {t} as {r} ({w}): expected {e}, got {g}" for m, t, r, w, e, g in failures)


async def test_another_merchants_list_is_empty_of_ours(http, world):
    """ListCheckouts answers 200 to every reader: what differs is whose checkouts are in it."""
    ours = {world.checkout}
    for role in ("staff", "admin"):
        got = await http.get("/v1/checkouts", params={"pageSize": 500}, headers=headers(role, OTHER_MERCHANT))
        assert got.status_code == 200, got.text
        assert not ours & {c["id"] for c in got.json()["checkouts"]}, role
        assert all(c["merchantId"] == OTHER_MERCHANT for c in got.json()["checkouts"]), role
        own = await http.get("/v1/checkouts", params={"productId": world.product}, headers=headers(role, TEST_MERCHANT))
        assert ours <= {c["id"] for c in own.json()["checkouts"]}, role
    mine = await http.get("/v1/checkouts", headers=headers("customer", "", world.customer))
    assert ours <= {c["id"] for c in mine.json()["checkouts"]}
    stranger = await http.get("/v1/checkouts", headers=headers("customer", "", "stranger-" + uuid.uuid4().hex[:6]))
    assert stranger.json()["checkouts"] == []


@pytest.mark.parametrize("role", NO_ORG_CHECKED)
async def test_a_staff_or_admin_token_without_org_is_401(http, world, role):
    r = await http.get(f"/v1/checkouts/{world.checkout}",
                       headers={"Authorization": f"Bearer {make_token(role, org='')}"})
    assert r.status_code == 401 and "org" in r.json()["detail"]


async def test_an_org_that_owns_nothing_sees_nothing(http, world):
    nobody = "merchant-empty-" + uuid.uuid4().hex[:6]
    staff, admin = headers("staff", nobody), headers("admin", nobody)
    for path in (f"/v1/checkouts/{world.checkout}", f"/v1/products/{world.product}/stock",
                 f"/v1/products/{world.product}/codes", f"/v1/payments/{world.payment}/events",
                 f"/v1/salons/{world.salon}/slots", f"/v1/salons/{world.salon}/bookings"):
        params = WINDOW if path.endswith("/slots") else {"day": "2026-01-01"} if path.endswith("/bookings") else None
        r = await http.get(path, headers=staff, params=params)
        assert r.status_code == 404, (path, r.text)
    listed = await http.get("/v1/checkouts", headers=staff)
    assert listed.status_code == 200 and listed.json()["checkouts"] == [], listed.text
    # ... and what it creates is its own, invisible to the first merchant's staff
    mine = (await http.post("/v1/products", json={"sku": "MX-SAME", "name": "same sku elsewhere",
                                                  "price": {"currencyCode": "TRY", "amountMinor": "1"}},
                            headers=admin)).json()
    assert mine["merchantId"] == nobody
    r = await http.get(f"/v1/products/{mine['id']}/stock", headers=headers("staff", TEST_MERCHANT))
    assert r.status_code == 404
