"""Least privilege between services: every (RPC, calling service) a caller table grants is an RPC
that service really calls (docs/security.md, "Who may call what").

The gateway calls exactly the RPCs of its route table (`gateway.policy.POLICY`, built from the
protos' google.api.http annotations); a service calls what its own code calls on a stub
(`stub.HoldSlot(...)`): the method names used in its package, servicer modules (grpc_api.py) left
out. A grant without such a caller is one an intruder in that service could use and nobody else
needs: remove it.

The same holds for what a caller may be: `system` only on the RPCs a service calls as itself (every
grant to a service other than the gateway, and no other), and only the user roles the gateway's
routes to that service admit.
"""
from __future__ import annotations

import pathlib
import re

import pytest

import booking.grpc_api
import codepool.claims_api
import codepool.grpc_api
import payments.checkout.grpc_api
import payments.claims.grpc_api
import payments.grpc_api
import payments.outbound.grpc_api
from gateway.policy import POLICY

REPO = pathlib.Path(__file__).resolve().parents[3]
MODULES = {"cuty.booking.v1.BookingService": booking.grpc_api, "cuty.codepool.v1.CodePoolService": codepool.grpc_api,
           "cuty.payments.v1.PaymentService": payments.grpc_api,
           "cuty.payments.v1.CheckoutService": payments.checkout.grpc_api,
           "cuty.payments.v1.WebhookEndpointService": payments.outbound.grpc_api,
           "cuty.codepool.v1.CodeClaimService": codepool.claims_api, "cuty.payments.v1.ClaimService": payments.claims.grpc_api}
TABLES = {svc: m.CALLERS for svc, m in MODULES.items()}

def stub_calls(service: str) -> set[str]:
    """Names called as `<something>.Name(` in a service's package, servicers left out."""
    names: set[str] = set()
    for f in (REPO / "services" / service / service).rglob("*.py"):
        if f.name != "grpc_api.py":
            names |= set(re.findall(r"\.([A-Z][A-Za-z0-9]+)\(", f.read_text()))
    return names


def grants() -> list[tuple[str, str]]:
    return sorted((f"{svc}.{rpc}", peer) for svc, table in TABLES.items() for rpc, peers in table.items()
                  for peer in peers)


def called(rpc: str, peer: str) -> bool:
    if peer == "gateway":
        return rpc in POLICY
    return rpc.rsplit(".", 1)[-1] in stub_calls(peer)


@pytest.mark.parametrize("rpc,peer", grants())
def test_every_grant_has_a_caller(rpc, peer):
    """No exceptions: a grant nobody uses is removed, with its RPC if nothing else calls it."""
    assert called(rpc, peer), f"{peer} is granted {rpc} but never calls it: remove the grant"


@pytest.mark.parametrize("svc", sorted(MODULES))
def test_system_exactly_where_a_service_calls_as_itself(svc):
    """Services other than the gateway bring no user, so each of their grants is a `system` one,
    and `system` is nowhere else (not on the gateway's RPCs, not on RPCs nobody calls)."""
    table, system = TABLES[svc], MODULES[svc].SYSTEM_RPCS
    assert set(system) == {rpc for rpc, peers in table.items() if set(peers) - {"gateway"}}


@pytest.mark.parametrize("svc", sorted(MODULES))
def test_user_roles_are_those_of_the_gateways_routes(svc):
    routes = {rpc: a for rpc, a in POLICY.items() if rpc.rsplit(".", 1)[0] == svc}
    assert set(MODULES[svc].USER_ROLES) == set().union(*(a.roles for a in routes.values() if a.roles))


def test_every_gateway_route_is_granted_to_the_gateway():
    granted = {rpc for rpc, peer in grants() if peer == "gateway"}
    assert set(POLICY) - granted == set()
