"""Pure rules of the code pool: validation, the state machines, masking, ids. No I/O."""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import os
import re
import time
import uuid
from dataclasses import dataclass, field

from cutylib import paging
from cutylib.errors import InvalidArgument

MAX_CODE_LENGTH = 256
MAX_ID_LENGTH = 128
MAX_TRANSACTION_ID_LENGTH = 256
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500

# Code status (the real stock) and its allowed transitions; the database trigger
# codes_guard_update enforces the same table (migrations/functions/codes_guard_update.sql).
# quarantined: held back with its batch; revoked: taken back after a claim, or its batch retired
# (final). A release (reserved -> available) in a held-back batch goes to quarantined or revoked.
AVAILABLE, RESERVED, DELIVERED = "available", "reserved", "delivered"
QUARANTINED, REVOKED = "quarantined", "revoked"
CODE_STATUSES = (AVAILABLE, RESERVED, DELIVERED, QUARANTINED, REVOKED)
CODE_TRANSITIONS = {(AVAILABLE, RESERVED), (RESERVED, DELIVERED), (RESERVED, AVAILABLE),
                    (AVAILABLE, QUARANTINED), (QUARANTINED, AVAILABLE), (QUARANTINED, REVOKED),
                    (RESERVED, QUARANTINED), (RESERVED, REVOKED), (DELIVERED, REVOKED)}
# Reservation (order) status; released -> reserved only when a late payment re-reserves.
RELEASED = "released"
RESERVATION_TRANSITIONS = {(RESERVED, DELIVERED), (RESERVED, RELEASED), (RELEASED, RESERVED)}

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def can_transition(table: set[tuple[str, str]], old: str, new: str) -> bool:
    return (old, new) in table


# --- validation ---------------------------------------------------------------------------------

def require_id(field_name: str, value: str, *, max_length: int = MAX_ID_LENGTH) -> str:
    if not value:
        raise InvalidArgument(field_name, f"{field_name} is required")
    if len(value) > max_length:
        raise InvalidArgument(field_name, f"{field_name} must be at most {max_length} characters, got {len(value)}")
    if _CONTROL.search(value):
        raise InvalidArgument(field_name, f"{field_name} must not contain control characters")
    return value


# `stock.low` when the available codes drop to or below a product's threshold
# (migrations/functions/codepool_check_stock.sql); the default suits a product sold a few at a time.
DEFAULT_LOW_STOCK_THRESHOLD = 10
MAX_LOW_STOCK_THRESHOLD = 1_000_000


def code_problem(value: str) -> str | None:
    """Why `value` cannot be a code, or None. Never echoes the value (codes stay out of logs)."""
    if not value or not value.strip():
        return "is empty"
    if len(value) > MAX_CODE_LENGTH:
        return f"is longer than {MAX_CODE_LENGTH} characters (got {len(value)})"
    if value != value.strip():
        return "has leading or trailing whitespace"
    if _CONTROL.search(value):
        return "contains a control character"
    return None


def require_codes(codes, offset: int = 0) -> None:
    """Raise InvalidArgument naming `codes[i]` (i counted across the whole stream) for the first bad code."""
    for i, value in enumerate(codes):
        problem = code_problem(value)
        if problem:
            raise InvalidArgument(f"codes[{offset + i}]", f"codes[{offset + i}] {problem}")


def page_size(requested: int) -> int:
    return paging.page_size(requested, default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)


def encode_page_token(last_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(b"cp1" + last_id.bytes).decode().rstrip("=")


def decode_page_token(token: str) -> uuid.UUID:
    """The code id after which the next page starts (the nil UUID: the first page)."""
    if not token:
        return uuid.UUID(int=0)
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 19 or not raw.startswith(b"cp1"):
        raise InvalidArgument("page_token", "page_token is not one this service issued")
    return uuid.UUID(bytes=raw[3:])


# --- presentation -------------------------------------------------------------------------------

def mask(value: str) -> str:
    """Staff see at most the last 4 characters, and never more than half of a short code."""
    shown = min(4, len(value) // 2)
    return "****" + (value[-shown:] if shown else "")


# --- ids ----------------------------------------------------------------------------------------

def new_code_ids(n: int) -> list[uuid.UUID]:
    """Time-ordered (UUIDv7 layout) ids, so imports append at the right edge of the primary key
    instead of touching random pages. Built in bulk because imports create millions."""
    ms = time.time_ns() // 1_000_000
    prefix = ms.to_bytes(6, "big")
    rand = os.urandom(10 * n)
    out = []
    for i in range(n):
        r = rand[10 * i:10 * i + 10]
        out.append(uuid.UUID(bytes=prefix + bytes((0x70 | (r[0] & 0x0F), r[1], 0x80 | (r[2] & 0x3F))) + r[3:]))
    return out


# --- views returned by the use cases ------------------------------------------------------------

@dataclass(frozen=True)
class ReservationView:
    order_id: str
    order_item_id: str
    product_id: str
    customer_id: str
    status: str
    quantity: int
    reserved_at: dt.datetime
    expires_at: dt.datetime
    unit_price_minor: int
    currency: str
    payment_transaction_id: str = ""
    code_ids: tuple[str, ...] = field(default_factory=tuple)
    merchant_id: str = ""  # the product's merchant

    @classmethod
    def from_row(cls, row, code_ids) -> "ReservationView":
        return cls(order_id=row["order_id"], order_item_id=row["order_item_id"], product_id=str(row["product_id"]),
                   customer_id=row["customer_id"], status=row["status"], quantity=row["quantity"],
                   reserved_at=row["reserved_at"], expires_at=row["expires_at"],
                   unit_price_minor=row["unit_price_minor"], currency=row["currency"],
                   payment_transaction_id=row["payment_transaction_id"] or "",
                   code_ids=tuple(str(c) for c in (code_ids or ())), merchant_id=row["merchant_id"])


@dataclass(frozen=True)
class ReserveCommand:
    order_id: str
    order_item_id: str
    product_id: uuid.UUID
    quantity: int
    customer_id: str

    def same_request(self, row) -> bool:
        """Whether a stored reservation is this request's own (a replay), not a conflicting one."""
        return (row["order_id"], row["order_item_id"], str(row["product_id"]), row["quantity"], row["customer_id"]) == (
            self.order_id, self.order_item_id, str(self.product_id), self.quantity, self.customer_id)
