"""Request validation from the contracts: the `buf.validate` annotations on every request message
in protos/ (protovalidate), enforced the same way by every service's gRPC server (the error
interceptor, cutylib.grpc_server) and by the gateway before it calls a service.

A message that breaks a rule is INVALID_ARGUMENT (HTTP 400) naming the field path as the proto
spells it (`slots[0].price.currency_code`); the message is the same over gRPC and HTTP:
`<field>: <what the rule says>`, every violation listed (up to MAX_LISTED), and each one a
`google.rpc.BadRequest` field violation. Checks that need the database (does the slot exist, is
the zone known to the tz database, is the window in the future) stay in the services' domains.

The protovalidate engine (Rust, behind a Python extension) compiles a message type's rules the
first time it sees the type and keeps them, so one Validator per process is enough: the rules are
compiled once per message type.
"""
from __future__ import annotations

import protovalidate
from google.protobuf.message import Message

from .errors import InvalidArgument

MAX_LISTED = 5
_validator = protovalidate.Validator()


class RequestInvalid(InvalidArgument):
    """A request that breaks its contract; `violations` is every (field path, description)."""

    def __init__(self, violations: list[tuple[str, str]]):
        listed = "; ".join(f"{f}: {d}" if f else d for f, d in violations[:MAX_LISTED])
        more = len(violations) - MAX_LISTED
        super().__init__(violations[0][0], listed + (f"; and {more} more" if more > 0 else ""))
        self.violations = violations


def field_path(path) -> str:
    """A buf.validate FieldPath as text: `slots[0].price.currency_code`, `labels["k"]`."""
    out = []
    for e in path.elements:
        part = e.field_name
        sub = e.subscript
        if sub is not None and sub.field is not None:
            key = sub.value
            part += f"[{key}]" if sub.field == "index" else (f'["{key}"]' if isinstance(key, str) else f"[{key}]")
        out.append(part)
    return ".".join(out)


def violations(message: Message) -> list[tuple[str, str]]:
    """Every rule `message` breaks, as (field path, description); [] when it is valid."""
    found = _validator.collect_violations(message)
    if not found:
        return []
    out = []
    for v in found:
        p = v.proto
        out.append((field_path(p.field), p.message))
    return out


def check(message: Message) -> None:
    """Raise RequestInvalid (INVALID_ARGUMENT) when `message` breaks a rule of its contract."""
    found = violations(message)
    if found:
        raise RequestInvalid(found)
