"""An in-memory stand-in for the PSP client (same methods as payments.psp.PspClient), for in-process
tests that need deterministic PSP answers. The e2e tests use the real simulator process."""
from __future__ import annotations

import secrets
from collections import Counter
from typing import Any

from payments.psp import PspError, PspUnavailable

INITIAL = {
    "pm_card_ok": "succeeded",
    "pm_card_declined": "failed",
    "pm_card_3ds": "requires_action",
    "pm_card_no_webhook": "processing",
}


class FakePsp:
    def __init__(self) -> None:
        self.intents: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.refunds: dict[str, dict[str, Any]] = {}
        self.charges: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.unavailable = 0  # the next N calls answer "unknown"

    def _maybe_down(self, op: str) -> None:
        self.calls[op] += 1
        if self.unavailable > 0:
            self.unavailable -= 1
            raise PspUnavailable(f"fake PSP down for {op}")

    async def create_intent(self, idempotency_key: str, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_down("create")
        if idempotency_key in self.by_key:
            return dict(self.intents[self.by_key[idempotency_key]])
        if body["payment_method"] not in INITIAL:
            raise PspError(400, {"code": "payment_method_unknown", "message": "unknown"})
        pi = f"pi_{secrets.token_hex(8)}"
        status = INITIAL[body["payment_method"]]
        intent = {"id": pi, "object": "payment_intent", "status": status, "amount": body["amount"],
                  "amount_refunded": 0, "currency": body["currency"], "metadata": body["metadata"],
                  "client_secret": f"{pi}_secret_x", "next_action": None, "last_payment_error": None}
        if status == "requires_action":
            intent["next_action"] = {"redirect_url": f"https://psp.example/3ds/{pi}"}
        if status == "failed":
            intent["last_payment_error"] = {"code": "card_declined"}
        if status == "succeeded":
            self.charges[idempotency_key] += 1
        self.intents[pi] = intent
        self.by_key[idempotency_key] = pi
        return dict(intent)

    def set_status(self, pi: str, status: str) -> dict[str, Any]:
        intent = self.intents[pi]
        if status == "succeeded" and intent["status"] != "succeeded":
            self.charges[[k for k, v in self.by_key.items() if v == pi][0]] += 1
        intent["status"] = status
        if status != "requires_action":
            intent["next_action"] = None
        return dict(intent)

    async def get_intent(self, intent_id: str) -> dict[str, Any]:
        self._maybe_down("get")
        return dict(self.intents[intent_id])

    async def cancel_intent(self, intent_id: str) -> dict[str, Any]:
        self._maybe_down("cancel")
        intent = self.intents[intent_id]
        if intent["status"] in ("succeeded", "failed"):
            raise PspError(409, {"code": "payment_intent_unexpected_state", "payment_intent": dict(intent)})
        return self.set_status(intent_id, "canceled")

    async def create_refund(self, idempotency_key: str, intent_id: str, metadata: dict[str, str]) -> dict[str, Any]:
        self._maybe_down("refund")
        if idempotency_key in self.refunds:
            return dict(self.refunds[idempotency_key])
        intent = self.intents[intent_id]
        if intent["status"] != "succeeded":
            raise PspError(400, {"code": "payment_intent_unexpected_state"})
        intent["amount_refunded"] = intent["amount"]
        refund = {"id": f"re_{secrets.token_hex(8)}", "object": "refund", "payment_intent": intent_id,
                  "amount": intent["amount"], "status": "succeeded", "metadata": metadata}
        self.refunds[idempotency_key] = refund
        return dict(refund)

    async def aclose(self) -> None:
        pass
