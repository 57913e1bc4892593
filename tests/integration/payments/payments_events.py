"""Building signed PSP webhook deliveries for tests."""
from __future__ import annotations

import json
import secrets
import time

from payments import signature

WEBHOOK_SECRET = "whsec_integration"
PREVIOUS_SECRET = "whsec_rotated_out"


def event(event_type: str, obj: dict, *, event_id: str | None = None, key: str | None = None) -> bytes:
    body = {"id": event_id or f"evt_{secrets.token_hex(10)}", "object": "event", "type": event_type,
            "created": int(time.time()), "data": {"object": obj}, "request": {"idempotency_key": key}}
    return json.dumps(body, separators=(",", ":")).encode()


def signed(secret: str, payload: bytes, t: int | None = None) -> tuple[tuple[str, str], ...]:
    return (("cuty-signature", signature.sign(secret, payload, t)),)
