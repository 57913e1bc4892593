"""Who is calling, for the handler: a contextvar set by the server interceptor (grpc_server.py).

A principal is built from two verified facts, never from plain metadata:
- the calling *service*, from its mutual-TLS certificate (tls.peer_service);
- the *user*, from the gateway's signed assertion (identity.AssertionVerifier), when there is one.

A call with a user acts as that user (only the gateway brings one). A call without one is `system`
when the RPC grants `system` to its peer (the orchestrator's saga steps, an operator CLI); from the
gateway it is `anonymous`, which every role check refuses as UNAUTHENTICATED (grpc_server.Trust).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from .errors import PermissionDenied, Unauthenticated

ANONYMOUS_ROLE = "anonymous"
SYSTEM_ROLE = "system"
USER_ROLES = ("customer", "staff", "admin", "operator")
# Roles bound to one merchant (the token's `org`); every other role acts across merchants (customers
# by their own customer id, the operator audited, the system for the saga). docs/tenancy.md.
MERCHANT_ROLES = frozenset({"staff", "admin"})


@dataclass(frozen=True)
class Principal:
    subject: str
    role: str
    org: str = ""  # the merchant of a staff or admin user

    def require_role(self, *roles: str) -> None:
        if self.role == ANONYMOUS_ROLE:
            raise Unauthenticated("a signed-in caller is required")
        if self.role not in roles:
            raise PermissionDenied(f"role {self.role!r} may not do this; needs one of {', '.join(roles)}")

    def merchant(self) -> str | None:
        """The merchant this caller is confined to, or None (any merchant). A staff or admin
        caller without one is refused (the gateway refuses such a token already; a service does
        not trust that it did)."""
        if self.role not in MERCHANT_ROLES:
            return None
        if not self.org:
            raise Unauthenticated(f"role {self.role!r} must belong to a merchant (the token's 'org' claim)")
        return self.org

    def require_subject(self) -> str:
        if not self.subject or self.role in (ANONYMOUS_ROLE, SYSTEM_ROLE):
            raise Unauthenticated("a signed-in caller is required")
        return self.subject


SYSTEM = Principal(subject="", role=SYSTEM_ROLE)
ANONYMOUS = Principal(subject="", role=ANONYMOUS_ROLE)
_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("cuty_principal", default=ANONYMOUS)


def current() -> Principal:
    return _current.get()


def set_current(p: Principal) -> contextvars.Token:
    return _current.set(p)


@contextlib.contextmanager
def acting_as(p: Principal):
    """`p` is the current principal inside the block (e.g. SYSTEM: the orchestrator's own calls to
    booking and the code pool, made in no customer's name); the one before it after."""
    token = _current.set(p)
    try:
        yield p
    finally:
        _current.reset(token)


def metadata_value(metadata, key: str) -> str:
    for k, v in metadata or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else v
    return ""
