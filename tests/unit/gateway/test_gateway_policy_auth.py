"""Route policy (docs/gateway.md's table), JWT verification and the rate limiter, without I/O."""
import time

import jwt
import pytest

from gateway import auth
from gateway.policy import POLICY, access_for
from gateway.problems import Problem
from gateway.ratelimit import RateLimiter, retry_after_header

SECRET = "unit-test-secret-of-at-least-32-bytes!"

# docs/gateway.md, "Authentication and roles": route -> who may call it ("its customer" is checked
# by the service).
# Staff and admins within their merchant (checked by the services), the operator across.
DESIGN_TABLE = {
    ("POST", "/v1/salons"): {"admin"},
    ("POST", "/v1/salons/{salon_id}:setCancellationPolicy"): {"admin"},  # The salon's merchant's
    ("POST", "/v1/salons/{salon_id}/resources"): {"admin"},
    ("POST", "/v1/salons/{salon_id}/slots:batchCreate"): {"admin"},
    ("GET", "/v1/salons/{salon_id}/slots"): {"customer", "staff", "admin", "operator"},
    ("GET", "/v1/salons/{salon_id}/bookings"): {"staff", "admin"},  # A day's agenda
    # services and working hours: the merchant's admins define them, every signed-in user reads
    ("POST", "/v1/salons/{salon_id}/services"): {"admin"},
    ("GET", "/v1/salons/{salon_id}/services"): {"customer", "staff", "admin", "operator"},
    ("POST", "/v1/salons/{salon_id}/resources/{resource_id}:setWorkingHours"): {"admin"},
    ("POST", "/v1/salons/{salon_id}:setHoursOverride"): {"admin"},
    ("POST", "/v1/salons/{salon_id}:setBookingSettings"): {"admin"},
    ("GET", "/v1/salons/{salon_id}/services/{service_id}/availability"): {"customer", "staff", "admin", "operator"},
    ("POST", "/v1/products"): {"admin"},
    ("POST", "/v1/products/{product_id}/codes:import"): {"admin"},
    ("GET", "/v1/products/{product_id}/stock"): {"staff", "admin", "operator"},
    ("GET", "/v1/products/{product_id}/codes"): {"staff", "admin", "operator"},
    ("POST", "/v1/codes/{code_id}:reveal"): {"admin"},
    ("POST", "/v1/checkouts"): {"customer"},
    ("POST", "/v1/checkouts/{checkout_id}:pay"): {"customer"},
    ("GET", "/v1/checkouts/{checkout_id}"): {"customer", "staff", "admin", "operator"},  # admin can do what staff can
    ("POST", "/v1/checkouts/{checkout_id}:cancel"): {"customer", "staff", "admin"},  # Staff cancel
    ("POST", "/v1/checkouts/{checkout_id}:reschedule"): {"customer", "staff", "admin"},
    ("GET", "/v1/checkouts"): {"customer", "staff", "admin", "operator"},  # Lists
    ("GET", "/v1/checkouts/{checkout_id}:watch"): {"customer", "staff", "admin", "operator"},  # SSE
    ("POST", "/v1/checkouts/{checkout_id}:retry"): {"admin", "operator"},  # Retry of NEEDS_ATTENTION
    # staff book for a customer, record a payment at the desk and a no-show (their merchant's only)
    ("POST", "/v1/checkouts:createForCustomer"): {"staff", "admin"},
    ("POST", "/v1/checkouts/{checkout_id}:markPaid"): {"staff", "admin"},
    ("POST", "/v1/checkouts/{checkout_id}:markNoShow"): {"staff", "admin"},
    ("GET", "/v1/payments/{payment_id}/events"): {"staff", "admin", "operator"},
    ("GET", "/v1/payments:lookup"): {"staff", "admin", "operator"},  # A payment by its PSP intent id
    ("POST", "/v1/payments/{payment_id}:refund"): {"staff", "admin"},  # The merchant's refunds
    ("POST", "/v1/psp/webhooks"): None,
    # After a code is sold (docs/codepool.md, "Claims"): the buyer's own, the merchant's staff and admins.
    ("POST", "/v1/checkouts/{checkout_id}/codes/{code_id}:claim"): {"customer", "staff", "admin"},
    ("GET", "/v1/claims/{claim_id}"): {"customer", "staff", "admin"},
    ("GET", "/v1/claims"): {"customer", "staff", "admin"},
    ("POST", "/v1/claims/{claim_id}:resolve"): {"admin"},
    ("POST", "/v1/products/{product_id}:setClaimThreshold"): {"admin"},
    ("GET", "/v1/products/{product_id}/batches"): {"staff", "admin"},
    ("POST", "/v1/products/{product_id}/batches/{batch_id}:release"): {"admin"},
    ("POST", "/v1/products/{product_id}/batches/{batch_id}:retire"): {"admin"},
    ("GET", "/v1/products/{product_id}/batches/{batch_id}/claims:export"): {"admin"},
    # A merchant's webhook endpoints and delivery log: its admins only.
    ("POST", "/v1/webhookEndpoints"): {"admin"},
    ("GET", "/v1/webhookEndpoints"): {"admin"},
    ("DELETE", "/v1/webhookEndpoints/{endpoint_id}"): {"admin"},
    ("GET", "/v1/webhookEndpoints/{endpoint_id}/deliveries"): {"admin"},
    ("POST", "/v1/webhookEndpoints/{endpoint_id}/deliveries/{delivery_id}:redeliver"): {"admin"},
}


def test_every_annotated_route_has_the_designed_policy(routes):
    served = {(r.http_method, r.template.source): access_for(r.rpc) for r in routes.values()}
    assert set(served) == set(DESIGN_TABLE), "a route was added or removed: update policy.py and this table"
    for key, roles in DESIGN_TABLE.items():
        assert served[key].roles == (None if roles is None else frozenset(roles)), key


def test_idempotency_key_required_exactly_on_create_pay_reschedule_refund_and_claims(routes):
    need = {r.template.source for r in routes.values() if access_for(r.rpc).idempotency_key}
    assert need == {"/v1/checkouts", "/v1/checkouts/{checkout_id}:pay", "/v1/payments/{payment_id}:refund",
                    "/v1/checkouts/{checkout_id}:reschedule", "/v1/checkouts:createForCustomer",
                    "/v1/checkouts/{checkout_id}/codes/{code_id}:claim", "/v1/claims/{claim_id}:resolve"}


def test_unknown_rpc_is_denied_to_everyone():
    a = access_for("cuty.x.v1.X.Y")
    assert a.roles == frozenset() and not a.public
    assert all(k.count(".") >= 4 for k in POLICY)


def token(**claims):
    base = {"sub": "u1", "role": "customer", "exp": int(time.time()) + 60}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, SECRET, algorithm="HS256")


def verify(header, secret=SECRET, **kw):
    """The principal of an Authorization header, as the gateway gets it (header, then token)."""
    import asyncio

    return asyncio.run(auth.Verifier(secret, leeway=0, **kw)(auth.token_of(header)))


def test_valid_token():
    p = verify(f"Bearer {token(role='staff', org='m-1')}")
    assert (p.subject, p.role, p.org) == ("u1", "staff", "m-1")


@pytest.mark.parametrize("header", [
    None, "", "Basic dTpw", "Bearer", "Bearer not.a.jwt",
    f"Bearer {token(exp=int(time.time()) - 5)}",
    f"Bearer {jwt.encode({'sub': 'u1', 'role': 'admin', 'exp': int(time.time()) + 60}, 'another-secret-also-32-bytes-long!!', algorithm='HS256')}",
    f"Bearer {token(role='system')}", f"Bearer {token(role=None)}", f"Bearer {token(sub=None)}",
    f"Bearer {token(exp=None)}", f"Bearer {token(sub='')}",
    f"Bearer {jwt.encode({'sub': 'u1', 'role': 'admin', 'exp': int(time.time()) + 60}, None, algorithm='none')}",
], ids=["none", "empty", "basic", "bearer-alone", "not-a-jwt", "expired", "other-secret", "role-system", "no-role",
        "no-sub", "no-exp", "empty-sub", "alg-none"])  # tokens carry times: fixed ids for every collection
def test_invalid_tokens_are_401(header):
    with pytest.raises(Problem) as e:
        verify(header)
    assert e.value.status == 401 and "www-authenticate" in e.value.headers


def test_issue_round_trips():
    p = verify("Bearer " + auth.issue(SECRET, "admin-1", "admin", org="m-1"))
    assert (p.subject, p.role, p.org) == ("admin-1", "admin", "m-1")


def test_token_bucket_per_key():
    now = [100.0]
    rl = RateLimiter(2.0, 3, clock=lambda: now[0])
    assert [rl.take("a") for _ in range(3)] == [0, 0, 0]
    wait = rl.take("a")
    assert wait == pytest.approx(0.5)
    assert rl.take("b") == 0  # another caller has its own bucket
    now[0] += 0.5
    assert rl.take("a") == 0
    assert rl.take("a") > 0
    assert retry_after_header(0.01) == "1" and retry_after_header(2.2) == "3"


def test_rate_limiter_disabled_and_pruned():
    assert RateLimiter(0, 10).take("x") == 0
    now = [0.0]
    rl = RateLimiter(1000.0, 1, max_keys=10, clock=lambda: now[0])
    for i in range(50):
        now[0] += 0.001
        rl.take(f"k{i}")
    assert len(rl._buckets) <= 11


async def test_verifier_caches_until_exp_only():
    now = [time.time()]
    v = auth.Verifier(SECRET, leeway=0, clock=lambda: now[0])
    tok = token(exp=int(now[0]) + 10, sub="cached")
    assert (await v(tok)).subject == "cached" and (await v(tok)).subject == "cached"
    assert v.verified == 1  # the second answer came from the cache
    now[0] += 11  # past exp by our clock: the cached entry is dropped and the token checked again
    await v(tok)
    assert v.verified == 2
    with pytest.raises(Problem):
        await v(jwt.encode({'sub': 'u', 'role': 'admin', 'exp': int(time.time()) + 60}, 'x' * 40, algorithm='HS256'))


async def test_token_cache_is_keyed_by_the_token_not_the_header():
    """`Bearer` + 15 KB of spaces + a valid token used to be a new 16 KB cache entry per request."""
    v = auth.Verifier(SECRET, leeway=0)
    tok = token(sub="padded")
    headers = [f"{scheme}{' ' * pad}{tok}{' ' * (pad % 7)}"
               for pad in range(1, 2501) for scheme in ("Bearer", "bearer", "BEARER", "BeArEr")]
    assert len(headers) == 10_000
    for h in headers:
        assert (await v(auth.token_of(h))).subject == "padded"
    assert len(v._cache) == 1 and v.verified == 1


async def test_token_cache_is_bounded_by_bytes():
    v = auth.Verifier(SECRET, leeway=0, max_bytes=10_000)
    for i in range(200):
        await v(token(sub=f"user-{i}", pad="x" * 500))
    assert v._bytes <= 10_000 and sum(len(t) for t in v._cache) == v._bytes


def test_oversized_token_is_refused_before_any_check():
    with pytest.raises(Problem) as e:
        auth.token_of("Bearer " + "a" * 9000)
    assert e.value.status == 401


@pytest.mark.parametrize("role", ["staff", "admin"])
def test_a_merchant_role_without_org_is_401(role):
    with pytest.raises(Problem) as e:
        auth.principal_of({"sub": "u1", "role": role, "exp": int(time.time()) + 60})
    assert e.value.status == 401 and "org" in e.value.detail


def test_org_binds_staff_and_admins_only():
    exp = int(time.time()) + 60
    assert auth.principal_of({"sub": "u1", "role": "staff", "org": "m-1", "exp": exp}).org == "m-1"
    # customers and the platform's operator belong to no merchant, whatever their token says
    assert auth.principal_of({"sub": "u1", "role": "customer", "org": "m-1", "exp": exp}).org == ""
    assert auth.principal_of({"sub": "u1", "role": "operator", "exp": exp}).org == ""
    for bad in ("", "   ", "x" * 201, 7):
        with pytest.raises(Problem):
            auth.principal_of({"sub": "u1", "role": "admin", "org": bad, "exp": exp})
