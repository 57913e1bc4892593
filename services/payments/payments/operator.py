"""Who did an operator action (a retry of a NEEDS_ATTENTION checkout, a refund by hand), as the
payment timeline records it (issue 15, "Operator's view").

- A user (through the gateway, with the gateway-signed assertion) is recorded as `<role>:<subject>`
  from that assertion; nothing the user sends can change it.
- The payments service's own tooling (`python -m payments ops`, run in the payments pod with the
  service's certificate) acts as `system`. It names the human with gRPC metadata `cuty-operator`
  (`--by`), recorded as `ops:<name>`. The metadata is honoured only for `system`: a `system` caller
  can already do everything these RPCs do, so naming someone grants nothing; from a user it is
  ignored (the assertion decides who they are), so a user cannot act as, or blame, someone else.
"""
from __future__ import annotations

from cutylib import principal
from cutylib.errors import InvalidArgument

OPERATOR_KEY = "cuty-operator"
MAX_NAME = 64


def clean_name(name: str, field: str = "by") -> str:
    """An operator's name as it may be recorded: 1..64 printable characters, no spaces around."""
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise InvalidArgument(field, f"{field} must be 1..{MAX_NAME} printable characters (who is acting), "
                                     f"got {name!r}")
    return name


def who(caller: principal.Principal, metadata) -> str:
    """The actor to record for `caller` (the handler's principal) and the call's metadata."""
    if caller.role == principal.SYSTEM_ROLE:
        named = principal.metadata_value(metadata, OPERATOR_KEY)
        return f"ops:{clean_name(named, OPERATOR_KEY)}" if named else "system"
    return f"{caller.role}:{caller.subject}"
