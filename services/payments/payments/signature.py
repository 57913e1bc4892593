"""Verification of the PSP's webhook signature: `Cuty-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`,
HMAC-SHA256 keyed with the webhook secret over the raw bytes `b"<t>." + body` (docs/payments.md, "Webhooks").

The timestamp is signed, so a captured delivery cannot be replayed outside the tolerance window,
which applies in both directions (a timestamp from the future is as suspicious as a stale one).
Several `v1` values are accepted, each checked against the current and the previous secrets, so a
secret can be rotated without refusing deliveries in flight.
"""
from __future__ import annotations

import hashlib
import hmac
import string
import time
from typing import Sequence

from cutylib.errors import Unauthenticated

TOLERANCE_SECONDS = 300
# A unix time has 10 digits until 2286. Longer is malformed, and int() of thousands of digits
# raises ValueError (Python's integer string limit): that became a 500.
MAX_TIMESTAMP_DIGITS = 12
_HEX = frozenset(string.hexdigits)


def expected(secret: str, payload: bytes, t: int) -> str:
    return hmac.new(secret.encode(), f"{t}.".encode() + payload, hashlib.sha256).hexdigest()


def sign(secret: str, payload: bytes, t: int | None = None) -> str:
    """The header the PSP would send (used by tests and tools)."""
    t = int(time.time()) if t is None else t
    return f"t={t},v1={expected(secret, payload, t)}"


def _parse(header: str) -> tuple[int, list[str]]:
    t: int | None = None
    sigs: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise Unauthenticated("malformed Cuty-Signature: expected t=<unix>,v1=<hex>", reason="signature-malformed")
        if key == "t":
            if t is not None or not (value.isascii() and value.isdigit()) or len(value) > MAX_TIMESTAMP_DIGITS:
                raise Unauthenticated("malformed Cuty-Signature timestamp", reason="signature-malformed")
            t = int(value)
        elif key == "v1":
            if len(value) != 64 or not set(value) <= _HEX:
                raise Unauthenticated("malformed Cuty-Signature v1: expected 64 hex digits", reason="signature-malformed")
            sigs.append(value.lower())
        # other schemes (v0, future versions) are ignored, as the PSP documents
    if t is None or not sigs:
        raise Unauthenticated("malformed Cuty-Signature: needs t= and at least one v1=", reason="signature-malformed")
    return t, sigs


def verify(header: str | None, payload: bytes, secrets: Sequence[str], *, tolerance: int = TOLERANCE_SECONDS,
           now: float | None = None) -> None:
    """Raise Unauthenticated unless `header` signs `payload` with one of `secrets` within `tolerance`."""
    if not header:
        raise Unauthenticated("missing Cuty-Signature", reason="signature-missing")
    t, sigs = _parse(header)
    now = time.time() if now is None else now
    if t < now - tolerance:
        raise Unauthenticated(f"Cuty-Signature timestamp is older than {tolerance} s", reason="signature-stale")
    if t > now + tolerance:
        raise Unauthenticated(f"Cuty-Signature timestamp is more than {tolerance} s ahead", reason="signature-future")
    ok = False
    for secret in secrets:
        want = expected(secret, payload, t).encode()
        for sig in sigs:
            # Every pair is compared, in constant time each, so timing says nothing about which matched.
            ok |= hmac.compare_digest(want, sig.encode())
    if not ok:
        raise Unauthenticated("Cuty-Signature does not match the payload", reason="signature-mismatch")


def secrets_from(current: str, previous: str) -> list[str]:
    """The current secret and the comma-separated previous ones (CUTY_PSP_WEBHOOK_PREVIOUS_SECRETS)."""
    return [current] + [s.strip() for s in previous.split(",") if s.strip()]
