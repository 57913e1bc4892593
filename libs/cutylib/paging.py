"""List paging shared by the services: `page_size` (0: the default, at most MAX) and opaque page
tokens over a monotonic key (a sequence number). A token a service did not issue is
INVALID_ARGUMENT naming `page_token`."""
from __future__ import annotations

import base64
import binascii
import struct

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
