"""Who did an operator action (a retry of a NEEDS_ATTENTION checkout, a refund by hand), as the
payment timeline records it (docs/observability.md, "The operator's view"); and the record kept of every
read the platform's operator makes across merchants (`OperatorReads`).

- A user (through the gateway, with the gateway-signed assertion) is recorded as `<role>:<subject>`
  from that assertion; nothing the user sends can change it.
- The payments service's own tooling (`python -m payments ops`, run in the payments pod with the
  service's certificate) acts as `system`. It names the human with gRPC metadata `cuty-operator`
  (`--by`), recorded as `ops:<name>`. The metadata is honoured only for `system`: a `system` caller
  can already do everything these RPCs do, so naming someone grants nothing; from a user it is
  ignored (the assertion decides who they are), so a user cannot act as, or blame, someone else.
"""
from __future__ import annotations

from cutylib import principal, tenancy
from cutylib.errors import InvalidArgument
from cutylib.telemetry import current_trace_id

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


# Every read of the platform's operator (support, across merchants) leaves a row here, written
# before the answer is sent.
AUDIT_OPERATOR_READ = """
INSERT INTO operator_reads (subject, rpc, object_id, of_merchant, trace_id) VALUES ($1, $2, $3, $4, $5)
"""


class OperatorReads:
    """The audit of the operator's reads across merchants (docs/tenancy.md)."""

    def __init__(self, db) -> None:
        self.db = db

    async def record(self, caller: principal.Principal, rpc: str, object_id: str, merchant_id: str | None) -> None:
        """Keep who read what of whose, when `caller` is the platform's operator (others: nothing)."""
        if caller.role == tenancy.OPERATOR_ROLE:
            await self.db.execute(AUDIT_OPERATOR_READ, caller.subject, rpc, object_id, merchant_id,
                                  current_trace_id())
