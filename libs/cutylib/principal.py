"""Who is calling. The gateway verifies the JWT and passes the principal as gRPC metadata;
services read it from a contextvar set by the server interceptor. Internal callers with no
principal metadata act as the `system` role."""
from __future__ import annotations

import contextvars
from dataclasses import dataclass

from .errors import PermissionDenied, Unauthenticated

SUBJECT_KEY = "cuty-subject"
ROLE_KEY = "cuty-role"
ROLES = ("customer", "staff", "admin", "system")


@dataclass(frozen=True)
class Principal:
    subject: str
    role: str

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((SUBJECT_KEY, self.subject), (ROLE_KEY, self.role))

    def require_role(self, *roles: str) -> None:
        if self.role not in roles:
            raise PermissionDenied(f"role {self.role!r} may not do this; needs one of {', '.join(roles)}")

    def require_subject(self) -> str:
        if not self.subject:
            raise Unauthenticated("a signed-in caller is required")
        return self.subject


SYSTEM = Principal(subject="", role="system")
_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("cuty_principal", default=SYSTEM)


def current() -> Principal:
    return _current.get()


def set_current(p: Principal) -> contextvars.Token:
    return _current.set(p)


def from_metadata(metadata) -> Principal:
    md = {k: v for k, v in (metadata or ())}
    role = md.get(ROLE_KEY) or "system"
    if role not in ROLES:
        role = "customer"  # unknown roles get the least privilege
    return Principal(subject=md.get(SUBJECT_KEY, ""), role=role)


def metadata_value(metadata, key: str) -> str:
    for k, v in metadata or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else v
    return ""
