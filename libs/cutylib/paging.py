"""List paging shared by the services: `page_size` (0: the default, at most MAX) and opaque page
tokens over a monotonic key (a sequence number), or over a keyset (an instant and ids) bound to the
query that issued it. A token a service did not issue is
INVALID_ARGUMENT naming `page_token`."""
from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import uuid
from datetime import datetime, timedelta, timezone

from .errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
_TAG = b"sq1"


def page_size(requested: int, *, default: int = DEFAULT_PAGE_SIZE, maximum: int = MAX_PAGE_SIZE) -> int:
    if requested < 0:
        raise InvalidArgument("page_size", f"page_size must be between 0 and {maximum}, got {requested}")
    return min(requested or default, maximum)


def encode_seq(seq: int) -> str:
    return base64.urlsafe_b64encode(_TAG + struct.pack(">q", seq)).decode().rstrip("=")


def decode_seq(token: str) -> int:
    """The sequence number after which the page starts (0 for the first page)."""
    if not token:
        return 0
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 11 or not raw.startswith(_TAG):
        raise InvalidArgument("page_token", "page_token is not one this service issued")
    (seq,) = struct.unpack(">q", raw[3:])
    if seq < 0:
        raise InvalidArgument("page_token", "page_token is not one this service issued")
    return seq


# --- keyset tokens (lists ordered by an instant and ids) --------------------------------
# A token carries the last row's key (an instant in microseconds and its uuids) and a fingerprint of
# the query it belongs to (the caller and the filters), so a token replayed with another query is
# refused (INVALID_ARGUMENT naming `page_token`) instead of silently paging something else.
_KEYSET_TAG = b"ks1"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def query_fingerprint(*parts: object) -> bytes:
    """8 bytes naming a query: its caller and filters, in a fixed order."""
    return hashlib.sha256("\x1f".join("" if p is None else str(p) for p in parts).encode()).digest()[:8]


def _encode(query: bytes, at: datetime, tail: bytes) -> str:
    micros = (at - _EPOCH) // timedelta(microseconds=1)
    return base64.urlsafe_b64encode(_KEYSET_TAG + query + struct.pack(">q", micros) + tail).decode().rstrip("=")


def _decode(token: str, query: bytes, tail_ok) -> tuple[datetime, bytes]:
    """A keyset token's instant and the bytes after it (`tail_ok(n)`: whether n such bytes may be);
    a token that was not issued for this same query is INVALID_ARGUMENT naming `page_token`."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) < 19 or not tail_ok(len(raw) - 19) or not raw.startswith(_KEYSET_TAG):
        raise InvalidArgument("page_token", "page_token is not one this service issued")
    if raw[3:11] != query:
        raise InvalidArgument("page_token", "page_token belongs to another query (the filters changed); "
                                            "start again without it")
    (micros,) = struct.unpack(">q", raw[11:19])
    try:
        return _EPOCH + timedelta(microseconds=micros), raw[19:]
    except OverflowError:
        raise InvalidArgument("page_token", "page_token is not one this service issued") from None


def encode_keyset(query: bytes, at: datetime, *ids: uuid.UUID) -> str:
    return _encode(query, at, b"".join(i.bytes for i in ids))


def decode_keyset(token: str, query: bytes, n_ids: int) -> tuple[datetime, tuple[uuid.UUID, ...]] | None:
    """The key after which the page starts (None for the first page); a token that was not issued
    for this same query is INVALID_ARGUMENT naming `page_token`."""
    if not token:
        return None
    at, tail = _decode(token, query, lambda n: n == 16 * n_ids)
    return at, tuple(uuid.UUID(bytes=tail[16 * i:16 * i + 16]) for i in range(n_ids))


# A keyset whose tie-breaker is a text key (an order id the caller chose) instead of uuids: the
# same token with the key's UTF-8 bytes after the instant.
MAX_TEXT_KEY_BYTES = 512


def encode_keyset_text(query: bytes, at: datetime, key: str) -> str:
    return _encode(query, at, key.encode())


def decode_keyset_text(token: str, query: bytes) -> tuple[datetime, str] | None:
    """As decode_keyset, for a token of encode_keyset_text."""
    if not token:
        return None
    at, tail = _decode(token, query, lambda n: n <= MAX_TEXT_KEY_BYTES)
    try:
        return at, tail.decode()
    except UnicodeDecodeError:
        raise InvalidArgument("page_token", "page_token is not one this service issued") from None
