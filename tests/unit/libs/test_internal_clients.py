"""Internal clients (cutylib.clients, docs/clients.md): the configuration is checked at start, and
every service's Trust holds a client to the public API only, with each route's roles, as itself
or as the user whose token it forwards. The matrix below runs over every RPC of every service."""
from __future__ import annotations

import asyncio
import json

import pytest
from google.protobuf import descriptor_pool

from cutylib import clients, tokens
from cutylib.access import POLICY
from cutylib.config import DEV_JWT_SECRET
from cutylib.errors import InvalidArgument, PermissionDenied, Unauthenticated
from cutylib.grpc_server import Trust
from cutylib.identity import ASSERTION_KEY

from test_every_grant_has_a_caller import MODULES

ROLES = ("customer", "staff", "admin", "operator")
SELF = {"identity": "pos", "acts_as": {"role": "staff", "merchant": "m-1"}}


class Context:
    """What Trust reads of a call: the verified certificate's names and the peer's address."""

    def __init__(self, identity: str):
        self.identity = identity

    def auth_context(self):
        return {"transport_security_type": [b"ssl"], "peer_dns": [self.identity.encode()]}

    def peer(self):
        return "ipv4:127.0.0.1:5000"


def trust_for(svc: str, config: list[dict]) -> Trust:
    module = MODULES[svc]
    t = Trust(svc.split(".")[1], verifier=object(), clients=clients.parse({"clients": config}),
              token_verifier=tokens.TokenVerifier(DEV_JWT_SECRET, leeway=0))
    t.add(descriptor_pool.Default().FindServiceByName(svc), module.CALLERS, system=module.SYSTEM_RPCS,
          roles=module.USER_ROLES)
    return t


def decide(t: Trust, svc: str, rpc: str, identity: str, metadata=()):
    try:
        return asyncio.run(t.principal(f"/{svc}/{rpc}", Context(identity), metadata))
    except (PermissionDenied, Unauthenticated, InvalidArgument) as e:
        return e


def rpcs():
    return [(svc, rpc) for svc, m in MODULES.items() for rpc in m.CALLERS]


def bearer(role: str, org: str | None = None, secret: str = DEV_JWT_SECRET):
    return ((tokens.BEARER_KEY, "Bearer " + tokens.issue(secret, f"{role}-1", role, org=org)),
            ("idempotency-key", "k-1"))


@pytest.mark.parametrize("svc,rpc", rpcs())
def test_a_client_reaches_public_rpcs_with_their_route_roles_only(svc, rpc):
    """Acting as itself in each role, and for a user of each role: admitted exactly where the
    gateway's route admits that role (and the service admits it from the gateway); an RPC
    without a route, granted to services alone, is refused to every client."""
    access = POLICY.get(f"{svc}.{rpc}")
    public = "gateway" in MODULES[svc].CALLERS[rpc] and access is not None and bool(access.roles)
    t = trust_for(svc, [{"identity": f"as-{role}", "acts_as": {"role": role, **({"merchant": "m-1"} if role in (
        "staff", "admin") else {})}} for role in ROLES] + [{"identity": "app", "users": list(ROLES)}])
    for role in ROLES:
        org = "m-1" if role in ("staff", "admin") else ""
        admitted = public and role in access.roles and role in MODULES[svc].USER_ROLES
        itself = decide(t, svc, rpc, f"as-{role}", (("idempotency-key", "k-1"),))
        for_user = decide(t, svc, rpc, "app", bearer(role, org or None))
        for who in (itself, for_user):
            if admitted:
                assert (who.role, who.org) == (role, org), (rpc, role, who)
            else:
                assert isinstance(who, PermissionDenied), (rpc, role, who)
        if not public:
            assert "only the public API" in str(itself)


def test_refusals_name_what_is_wrong():
    svc, rpc = "cuty.payments.v1.CheckoutService", "CreateCheckout"
    t = trust_for(svc, [{"identity": "pos", "acts_as": {"role": "customer", "subject": "till"}, "users": ["customer"]},
                        {"identity": "app", "users": ["customer"]}, SELF | {"identity": "desk"}])
    key = (("idempotency-key", "k-1"),)
    # Not registered: neither a service of the table nor a client.
    e = decide(t, svc, rpc, "kiosk", key)
    assert isinstance(e, PermissionDenied) and clients.ENV in e.message
    # Itself: the configured user; the idempotency key is required where the route requires it.
    assert decide(t, svc, rpc, "pos", key).subject == "till"
    e = decide(t, svc, rpc, "pos")
    assert isinstance(e, InvalidArgument) and e.field == "idempotency-key"
    # A client for users only, without a token.
    e = decide(t, svc, rpc, "app", key)
    assert isinstance(e, Unauthenticated) and "forward the user's token" in e.message
    # A token from a client that is not configured for users; a bad token; a role it may not bring.
    assert isinstance(decide(t, svc, rpc, "desk", bearer("customer")), PermissionDenied)
    assert isinstance(decide(t, svc, rpc, "app", bearer("customer", secret="x" * 40)), Unauthenticated)
    assert isinstance(decide(t, svc, rpc, "app", bearer("staff", "m-1")), PermissionDenied)
    assert decide(t, svc, rpc, "app", bearer("customer")).subject == "customer-1"
    # A gateway assertion from a client, whatever it holds, is refused: only the gateway signs them.
    e = decide(t, svc, rpc, "pos", key + ((ASSERTION_KEY, "anything"),))
    assert isinstance(e, PermissionDenied) and "only the gateway" in e.message
    # The gateway itself is decided as before.
    assert decide(t, svc, rpc, "gateway").role == "anonymous"


@pytest.mark.parametrize("entry,why", [
    ({"identity": "gateway", "acts_as": {"role": "customer"}}, "platform's own services"),
    ({"identity": "pos.example.com", "acts_as": {"role": "customer"}}, "bare name"),
    ({"identity": "pos"}, "'acts_as'"),
    ({"identity": "pos", "acts_as": {"role": "system"}}, "acts_as.role"),
    ({"identity": "pos", "acts_as": {"role": "staff"}}, "acts_as.merchant"),
    ({"identity": "pos", "acts_as": {"role": "staff", "merchant": "*"}}, "acts_as.merchant"),
    ({"identity": "pos", "acts_as": {"role": "customer", "merchant": "m-1"}}, "only for staff and admins"),
    ({"identity": "pos", "users": ["system"]}, "users"),
    ({"identity": "pos", "acts_as": {"role": "customer"}, "extra": 1}, "must be an object"),
])
def test_a_malformed_configuration_is_refused_naming_the_entry(entry, why):
    with pytest.raises(clients.ClientConfigError) as e:
        clients.parse({"clients": [entry]})
    assert "clients[0]" in str(e.value) and why in str(e.value)


def test_configuration_from_a_file_or_inline_and_production_needs_the_identity_provider(monkeypatch, tmp_path):
    doc = {"clients": [{"identity": "pos", "users": ["customer"]}]}
    path = tmp_path / "clients.json"
    path.write_text(json.dumps(doc))
    for value in (str(path), json.dumps(doc)):
        monkeypatch.setenv(clients.ENV, value)
        assert clients.from_env()["pos"].user_roles == {"customer"}
    monkeypatch.setenv(clients.ENV, json.dumps({"clients": [SELF, SELF]}))
    with pytest.raises(clients.ClientConfigError, match="declared twice"):
        clients.from_env()
    monkeypatch.setenv(clients.ENV, json.dumps(doc))
    monkeypatch.setenv("CUTY_ENV", "production")
    with pytest.raises(clients.ClientConfigError, match="CUTY_JWT_JWKS_URL"):
        clients.from_env()
    for name in ("CUTY_JWT_JWKS_URL", "CUTY_JWT_ISSUER", "CUTY_JWT_AUDIENCE"):
        monkeypatch.setenv(name, "https://idp.example/x")
    assert "pos" in clients.from_env()
    monkeypatch.delenv(clients.ENV)
    assert clients.from_env() == {}
