"""Parsing request fields the same way in every service (four copies before): a bad
value is an InvalidArgument naming the field, with what was expected and (a bounded part of) what
came."""
from __future__ import annotations

import re
import uuid

from .errors import InvalidArgument

# The canonical hyphenated form only: ids are compared and stored as text elsewhere (the
# checkout saga, idempotency keys), so `{...}`, `urn:uuid:` or unhyphenated spellings are refused.
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def parse_uuid(field: str, value: object) -> uuid.UUID:
    """`value` (text, or a UUID already) as a UUID."""
    if isinstance(value, uuid.UUID):
        return value
    if not value:
        raise InvalidArgument(field, f"{field} is required")
    if not isinstance(value, str) or not _UUID.match(value):
        raise InvalidArgument(field, f"{field} must be a UUID like 8f14e45f-ceea-467f-a0e6-6f3a2a1b9c4d, "
                                     f"got {str(value)[:40]!r}")
    return uuid.UUID(value)


def canonical_uuid(field: str, value: object) -> str:
    """`parse_uuid` as the lower-case text every row and key stores."""
    return str(parse_uuid(field, value))
