"""Webhook signatures: ``Cuty-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "t.body")>``.

The same scheme as Stripe's: the timestamp is part of the signed payload so a captured
delivery cannot be replayed outside the tolerance window, and several ``v1`` values may be
present while a secret is being rotated.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

HEADER = "Cuty-Signature"
SCHEME = "v1"
DEFAULT_TOLERANCE_SECONDS = 300


def compute(secret: str, body: bytes, t: int) -> str:
    """Hex HMAC-SHA256 of ``f"{t}.".encode() + body`` keyed with ``secret``."""
    payload = str(int(t)).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).hexdigest()


def sign(secret: str | Sequence[str], body: bytes, t: int | None = None) -> str:
    """The header value for ``body`` at time ``t``: one ``v1`` per secret given."""
    t = int(time.time()) if t is None else int(t)
    secrets = [secret] if isinstance(secret, str) else list(secret)
    if not secrets:
        raise ValueError("no signing secret")
    return ",".join([f"t={t}"] + [f"{SCHEME}={compute(s, body, t)}" for s in secrets])


def parse(header: str) -> tuple[int | None, list[str]]:
    """Split a header into its timestamp and its ``v1`` values; unknown schemes are ignored."""
    t: int | None = None
    sigs: list[str] = []
    for part in (header or "").split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            if t is not None or not (value.isascii() and value.isdigit()):
                return None, []  # duplicate or non-numeric timestamp: refuse
            t = int(value)
        elif key == SCHEME and value:
            sigs.append(value.strip().lower())
    return t, sigs


def verify(
    header: str | None,
    body: bytes,
    secrets: str | Sequence[str],
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """True when some ``v1`` in ``header`` is a valid signature of ``body`` by some secret
    and the timestamp is within ``tolerance`` seconds of ``now`` (past or future)."""
    if not header:
        return False
    t, sigs = parse(header)
    if t is None or not sigs:
        return False
    now = time.time() if now is None else now
    if abs(now - t) > tolerance:
        return False
    secrets = [secrets] if isinstance(secrets, str) else list(secrets)
    ok = False
    for secret in secrets:
        expected = compute(secret, body, t).encode("ascii")
        for sig in sigs:
            # Compare every pair without short-circuiting: constant time per comparison.
            ok |= hmac.compare_digest(expected, sig.encode("ascii", "replace"))
    return ok
