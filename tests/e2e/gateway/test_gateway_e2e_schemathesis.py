"""Schemathesis against the running platform: every operation of the gateway's own /openapi.json,
as each role that may call it, with every check, a fixed seed and a bounded number of examples.
The document must state what the API enforces, and the API must keep what the document states:
any finding fails, except the few listed in ALLOWED (each with why it is out of the API's control).
Budget, seed and how to run it alone: docs/gateway.md, "Schemathesis".
"""
from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import time
import uuid
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import httpx
import pytest
import schemathesis
# Imported here, at collection, and not first inside the schema fixture: compiling this module deep
# in a fixture's call stack can raise CPython 3.11.7's "AST constructor recursion depth mismatch"
# (SystemError).
import schemathesis.specs.openapi.schemas  # noqa: F401
from hypothesis import HealthCheck, settings
from schemathesis.core.failures import FailureGroup, ServerError
from schemathesis.core.parameters import ParameterLocation
from schemathesis.openapi.checks import RejectedPositiveData

from tests.e2e.gateway.conftest import Devstack, make_token

SEED = 20261203
# Examples per operation and role in the fuzzing phase; the coverage phase adds its own boundary
# cases. CUTY_SCHEMATHESIS_EXAMPLES raises it for a longer local run.
EXAMPLES = int(os.environ.get("CUTY_SCHEMATHESIS_EXAMPLES", "8"))
ROLES = ("admin", "staff", "customer")
CUSTOMER = "customer-schemathesis"  # the seeded checkout's owner: the fuzzing customer sees it

CONFIG = f"""
seed = {SEED}
request-timeout = 20

[generation]
mode = "all"
max-examples = {EXAMPLES}
deterministic = true
database = "none"
no-shrink = true

[checks]
enabled = true

[phases.examples]
enabled = true
[phases.coverage]
enabled = true
[phases.fuzzing]
enabled = true
[phases.stateful]
enabled = false
"""


def _roles_of(operation) -> tuple[str | None, ...]:
    roles = operation.definition.raw.get("x-cuty-roles")
    if roles is None:  # public: no token
        return (None,)
    return tuple(r for r in ROLES if r in roles)


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory):
    """A platform of its own (what the fuzzer creates stays out of the other gateway tests'), with no
    rate limits (thousands of requests from one address) and short streams (a watch ends)."""
    d = Devstack(tmp_path_factory.mktemp("cuty-schemathesis") / "data",
                 CUTY_GATEWAY_RATE_PER_SECOND="0", CUTY_GATEWAY_ADDRESS_RATE_PER_SECOND="0",
                 CUTY_SSE_MAX_SECONDS="1").start()
    try:
        asyncio.run(d.wait_ready())
        known = _seed(d.url)
        yield d, known
        top = sorted(_spent.items(), key=lambda kv: -kv[1])[:12]
        print("\nseconds waiting on the gateway per operation:", ", ".join(f"{k} {v:.1f}" for k, v in top))
        print("cases:", sum(_turns.values()) + len(_turns), "by phase:", _phases)
    finally:
        d.stop()


def _seed(url: str) -> dict[str, str]:
    """Data for the operations to reach their logic: a salon with a stylist, a service, hours and
    slots; a product with codes; a held checkout of the fuzzing customer; a webhook endpoint.
    Path parameters of positive cases take these ids (random ids would only meet 404)."""
    admin = {"Authorization": f"Bearer {make_token('admin')}"}
    with httpx.Client(base_url=url, timeout=30) as c:
        def ok(r: httpx.Response) -> dict:
            assert r.status_code == 200, r.text
            return r.json()
        for _ in range(600):
            if c.get("/healthz").status_code == 200:
                break
            time.sleep(0.1)
        salon = ok(c.post("/v1/salons", json={"name": "Fuzz salon", "timeZone": "Europe/Istanbul"}, headers=admin))["id"]
        stylist = ok(c.post(f"/v1/salons/{salon}/resources", json={"name": "stylist"}, headers=admin))["id"]
        ok(c.post(f"/v1/salons/{salon}/resources/{stylist}:setWorkingHours", headers=admin, json={
            "intervals": [{"weekday": d, "opens": "09:00", "closes": "18:00"} for d in range(1, 8)]}))
        service = ok(c.post(f"/v1/salons/{salon}/services", headers=admin, json={
            "name": "Cut", "durationMinutes": 60, "resourceIds": [stylist],
            "price": {"currencyCode": "TRY", "amountMinor": "75000"}}))["id"]
        zone = ZoneInfo("Europe/Istanbul")
        day = dt.datetime.now(zone).date() + dt.timedelta(days=2)
        slots = []
        for h in range(9, 15):
            start = dt.datetime(day.year, day.month, day.day, h, tzinfo=zone)
            slots.append({"resourceId": stylist, "startTime": start.isoformat(),
                          "endTime": (start + dt.timedelta(hours=1)).isoformat(),
                          "price": {"currencyCode": "TRY", "amountMinor": "75000"}})
        slots = ok(c.post(f"/v1/salons/{salon}/slots:batchCreate", json={"slots": slots}, headers=admin))["slots"]
        product = ok(c.post("/v1/products", json={"sku": "FUZZ-1", "name": "Fuzz gift card",
                                                  "price": {"currencyCode": "TRY", "amountMinor": "10000"}},
                            headers=admin))["id"]
        batch = ok(c.post(f"/v1/products/{product}/codes:import", headers=admin, json={
            "batchRef": "fuzz-batch", "codes": [f"FUZZ-{uuid.uuid4().hex[:12].upper()}" for _ in range(20)]}))["batchId"]
        codes = ok(c.get(f"/v1/products/{product}/codes", headers=admin))
        code = (codes.get("codes") or [{}])[0].get("id", "")
        me = {"Authorization": f"Bearer {make_token('customer', CUSTOMER)}", "Idempotency-Key": uuid.uuid4().hex}
        checkout = ok(c.post("/v1/checkouts", json={"slotId": slots[0]["id"]}, headers=me))["id"]
        endpoint = ok(c.post("/v1/webhookEndpoints", headers=admin, json={
            "url": "https://merchant.example/hooks/cuty", "events": ["checkout.completed"]}))["id"]
    return {"salon_id": salon, "resource_id": stylist, "service_id": service, "product_id": product,
            "batch_id": batch, "checkout_id": checkout, "endpoint_id": endpoint, "code_id": code}


@pytest.fixture(scope="module")
def gateway_schema(fuzz_stack):
    d, _ = fuzz_stack
    config = schemathesis.Config.from_str(CONFIG)
    return schemathesis.openapi.from_url(f"{d.url}/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("gateway_schema")


@schema.parametrize()
@settings(derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_keeps_its_document(case, fuzz_stack):
    d, known = fuzz_stack
    path = case.meta.components.get(ParameterLocation.PATH) if case.meta is not None else None
    if path is not None and path.mode.is_positive:  # a schema-valid path names what exists
        for name in list(case.path_parameters or {}):
            if known.get(name):
                case.path_parameters[name] = known[name]
    # Each case as one of the roles that may call the operation, in turn (the authorization
    # matrix test covers the roles that may not).
    roles = _roles_of(case.operation)
    turn = _turns[case.operation.label] = _turns.get(case.operation.label, -1) + 1
    role = roles[turn % len(roles)]
    headers = {}
    if role is not None:
        sub = CUSTOMER if role == "customer" else f"{role}-schemathesis"
        headers["Authorization"] = f"Bearer {make_token(role, sub)}"
    began = time.monotonic()
    response = case.call(base_url=d.url, headers=headers)
    _spent[case.operation.label] = _spent.get(case.operation.label, 0.0) + time.monotonic() - began
    phase = case.meta.phase.name.value if case.meta is not None else "?"
    _phases[phase] = _phases.get(phase, 0) + 1
    try:
        case.validate_response(response, headers=headers, transport_kwargs={"base_url": d.url, "headers": headers})
    except FailureGroup as group:
        left = [f for f in group.exceptions if not _allowed(f, case, role, response)]
        if left:
            raise FailureGroup(left, f"as {role}: {group}") from None


_turns: dict[str, int] = {}
_spent: dict[str, float] = {}
_phases: dict[str, int] = {}


@dataclass(frozen=True)
class Allowed:
    """A schema-valid request the API refuses for a reason the document cannot put in a schema:
    400 naming `field` (a full match), its detail matching `detail`, on `operation` ("*": any),
    for `roles`."""
    operation: str
    field: str
    why: str
    roles: frozenset = frozenset(ROLES)
    detail: str = ""


ALLOWED = (
    Allowed("*", "pageToken", "a page token is opaque, only one the list issued is valid (said in each pageToken's "
                              "description); a random string cannot be one"),
    Allowed("ListCheckouts", "createdBefore", "created_before must be after created_after: a relation of two fields"),
    Allowed("ListSlots", "endTime", "end_time must be after start_time: a relation of two fields"),
    Allowed("GetAvailability", "endDay", "end_day no earlier than start_day and within 31 days of it"),
    Allowed("BatchCreateSlots", r"slots\[\d+\]\.(startTime|endTime)",
            "a slot starts in the future (depends on the clock) and ends after it starts"),
    Allowed("CreateSalon", "timeZone", "a name in the IANA tz database: no pattern says which names exist"),
    Allowed("SetWorkingHours", r"intervals(\[\d+\](\.closes)?)?",
            "an interval closes at another time than it opens, and two intervals of a day never open together"),
    Allowed("SetHoursOverride", r"intervals(\[\d+\](\.closes)?)?",
            "as SetWorkingHours; and a closed day has no intervals"),
    Allowed("CancelCheckout", "reason", "staff and admins give a reason to cancel a booking (the customer needs "
                                        "none): the schema is one for every role", frozenset({"staff", "admin"})),
    Allowed("ResolveClaim", "note", "a rejection says why (a note); the other resolutions need none"),
    Allowed("IssueRefund", r"amount\.amountMinor", "a refund is of more than zero (a price may be zero)"),
    Allowed("PayCheckout", r"acceptNoShowFee(\.amountMinor)?", "an accepted no-show fee is more than zero (Money "
                                                                "may be zero) and exactly the fee the slot names now "
                                                                "(the salon's policy)"),
    Allowed("CreateCheckout", r"acceptNoShowFee(\.amountMinor)?", "a no-show fee is accepted with a booking's "
                                                                   "purchase and its payment method (other fields), "
                                                                   "and is more than zero"),
    Allowed("CreateCheckout", "productId", "a product that exists: a random id names none (400, as for any id "
                                           "in a body; 404 is for the resource in the path)", detail="unknown product"),
    Allowed("CreateStaffCheckout", r"contact\.email", "the local part is at most 64 characters (RFC 5321), which "
                                                       "the pattern cannot say with its shape", detail=r".*local part"),
    Allowed("CreateStaffCheckout", "linkTtlSeconds", "a link's life is for a payment link only (the settlement "
                                                     "decides, another field)"),
    Allowed("CreateCheckout", "quantity", "a slot is booked once (quantity 0 or 1); 1..100 is a product's"),
    Allowed("CreateCheckout", "startTime", "a service time is a service and its start: start_time with service_id"),
    Allowed("CreateStaffCheckout", "startTime", "a service time is a service and its start: start_time with service_id"),
    Allowed("CreateCheckout", "serviceId", "start_time and resource_id are a service time's, given with service_id"),
    Allowed("CreateStaffCheckout", "serviceId", "start_time and resource_id are a service time's, given with service_id"),
    Allowed("CreateWebhookEndpoint", "url", "http:// only to a local receiver in development; no local or "
                                            "non-public host in production (what a name resolves to)"),
)


def _allowed(failure, case, role, response) -> bool:
    try:
        problem = response.json()
    except ValueError:
        return False
    if (isinstance(failure, ServerError) and response.status_code == 504 and problem.get("type") == "deadline-exceeded"
            and "Request-Timeout" in (case.headers or {})):
        # The client chose a deadline (Request-Timeout) shorter than the call took: the answer is the
        # documented 504 (outcome unknown, retry with the same key), not a fault of the API.
        return True
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 400:
        return False
    field, detail = problem.get("field", ""), problem.get("detail", "")
    op = case.operation.definition.raw.get("operationId", "")
    return any(a.operation in ("*", op) and role in a.roles and re.fullmatch(a.field, field)
               and re.match(a.detail, detail) and (a.operation != "*" or _has_parameter(case, field))
               for a in ALLOWED)


def _has_parameter(case, name: str) -> bool:
    return any(p.get("name") == name for p in case.operation.definition.raw.get("parameters", ()))
