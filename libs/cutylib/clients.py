"""Internal clients: services other than ours (a point of sale, a back office, a mobile backend)
that call the public gRPC API directly with a certificate of their own (docs/clients.md).

Declared by configuration, never in code: `CUTY_INTERNAL_CLIENTS` is a JSON document, inline or
the path of a file holding it, the same for every service:

    {"clients": [
      {"identity": "pos", "acts_as": {"role": "customer", "subject": "pos-front-desk"},
       "users": ["customer"]},
      {"identity": "backoffice", "acts_as": {"role": "staff", "merchant": "demo-salons"}}
    ]}

- `identity`: the name its mutual-TLS certificate carries (the one bare SAN, cutylib.tls.peer_service),
  never one of the platform's own services.
- `acts_as` (mode 1, itself): the fixed user it is when it sends no token: a role of
  cutylib.access, its merchant (required for staff and admins, refused for the others) and a subject
  (default: the identity).
- `users` (mode 2, on behalf of a user): the user roles it may bring by forwarding the user's own
  token in metadata `authorization: Bearer <token>`; each service verifies that token against the
  identity provider the gateway trusts (cutylib.tokens, same settings). A gateway assertion
  (`cuty-user`) from it is refused: only the gateway signs those.

A client reaches only the public RPCs (those with a gateway route, cutylib.access.POLICY), each
with the roles its route admits: never an RPC granted to services alone (`system`). The decision
is made where every other caller's is, grpc_server.Trust.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from .access import TOKEN_ROLES
from .config import env_str
from .principal import Principal
from .tenancy import MERCHANT_ROLES, merchant_id_problem

ENV = "CUTY_INTERNAL_CLIENTS"
MAX_CONFIG_BYTES = 1024 * 1024
MAX_CLIENTS = 1000
# Identities a client may never take: the platform's own services (and the PSP simulator).
RESERVED = frozenset({"gateway", "booking", "codepool", "payments", "pspsim"})


@dataclass(frozen=True)
class InternalClient:
    identity: str
    acts_as: Principal | None = None        # mode 1: who it is when it sends no token
    user_roles: frozenset[str] = frozenset()  # mode 2: the roles of the users whose tokens it may forward


class ClientConfigError(ValueError):
    """CUTY_INTERNAL_CLIENTS is malformed: the process refuses to start, naming the entry."""


def parse(document: dict) -> dict[str, InternalClient]:
    """The clients of a configuration document, by identity; ClientConfigError naming what is wrong."""
    if not isinstance(document, dict) or set(document) - {"clients"}:
        raise ClientConfigError(f"{ENV} must be an object with one key, 'clients'")
    entries = document.get("clients", [])
    if not isinstance(entries, list) or len(entries) > MAX_CLIENTS:
        raise ClientConfigError(f"{ENV}: 'clients' must be a list of at most {MAX_CLIENTS} entries")
    clients: dict[str, InternalClient] = {}
    for i, e in enumerate(entries):
        where = f"{ENV}: clients[{i}]"
        if not isinstance(e, dict) or set(e) - {"identity", "acts_as", "users"}:
            raise ClientConfigError(f"{where} must be an object with 'identity' and 'acts_as' and/or 'users'")
        identity = e.get("identity")
        if not isinstance(identity, str) or not identity or "." in identity or identity != identity.strip() \
                or len(identity) > 63 or identity == "localhost":
            raise ClientConfigError(f"{where}.identity must be a certificate's bare name (no dots, 1..63 "
                                    f"characters), got {identity!r}")
        if identity in RESERVED:
            raise ClientConfigError(f"{where}.identity {identity!r} is one of the platform's own services")
        if identity in clients:
            raise ClientConfigError(f"{where}.identity {identity!r} is declared twice")
        acts_as = None
        if e.get("acts_as") is not None:
            a = e["acts_as"]
            if not isinstance(a, dict) or set(a) - {"role", "merchant", "subject"}:
                raise ClientConfigError(f"{where}.acts_as must be an object with 'role', 'merchant', 'subject'")
            role, merchant, subject = a.get("role"), a.get("merchant", ""), a.get("subject", identity)
            if role not in TOKEN_ROLES:
                raise ClientConfigError(f"{where}.acts_as.role must be one of {', '.join(sorted(TOKEN_ROLES))}, "
                                        f"got {role!r}")
            if role in MERCHANT_ROLES:
                problem = merchant_id_problem(merchant)
                if problem is not None:
                    raise ClientConfigError(f"{where}.acts_as.merchant (required for role {role!r}) {problem}")
            elif merchant:
                raise ClientConfigError(f"{where}.acts_as.merchant is only for staff and admins, not {role!r}")
            if not isinstance(subject, str) or not subject.strip() or len(subject) > 200:
                raise ClientConfigError(f"{where}.acts_as.subject must be a non-empty string of at most 200 characters")
            acts_as = Principal(subject=subject, role=role, org=merchant)
        users = e.get("users", [])
        if not isinstance(users, list) or any(r not in TOKEN_ROLES for r in users):
            raise ClientConfigError(f"{where}.users must be a list of roles among {', '.join(sorted(TOKEN_ROLES))}")
        if acts_as is None and not users:
            raise ClientConfigError(f"{where} must have 'acts_as' (acting as itself) or 'users' (for its users), or both")
        clients[identity] = InternalClient(identity, acts_as, frozenset(users))
    return clients


def from_env() -> dict[str, InternalClient]:
    """The clients of `CUTY_INTERNAL_CLIENTS` (inline JSON, or a file's path); none when unset."""
    raw = env_str(ENV, "").strip()
    if not raw:
        return {}
    if not raw.startswith("{"):
        path = pathlib.Path(raw)
        try:
            if path.stat().st_size > MAX_CONFIG_BYTES:
                raise ClientConfigError(f"{ENV}: {raw} is larger than {MAX_CONFIG_BYTES} bytes")
            raw = path.read_text()
        except OSError as e:
            raise ClientConfigError(f"{ENV}: cannot read {raw}: {e.strerror}") from None
    try:
        document = json.loads(raw)
    except ValueError as e:
        raise ClientConfigError(f"{ENV} is not JSON: {e}") from None
    clients = parse(document)
    check_production(clients)
    return clients


def check_production(clients: dict[str, InternalClient]) -> None:
    """With CUTY_ENV=production, a client that forwards users needs the identity provider's keys,
    issuer and audience: the development HS256 secret is in this repository, and without issuer
    and audience any token the provider signs for another application would pass as ours."""
    if env_str("CUTY_ENV", "development") != "production" or not any(c.user_roles for c in clients.values()):
        return
    unset = [n for n in ("CUTY_JWT_JWKS_URL", "CUTY_JWT_ISSUER", "CUTY_JWT_AUDIENCE") if not env_str(n, "")]
    if unset:
        raise ClientConfigError(f"{ENV} lets clients forward users' tokens, so {', '.join(unset)} must be set "
                                "(the identity provider the gateway trusts)")
