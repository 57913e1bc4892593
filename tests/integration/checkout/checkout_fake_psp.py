"""An in-memory PSP client (the four calls of payments.psp.PspClient) for in-process saga tests;
`charges` counts captures per Idempotency-Key, `unavailable[op] = n` answers "unknown" n times."""
from __future__ import annotations

import secrets
from collections import Counter

from payments.psp import PspError, PspUnavailable

INITIAL = {"pm_card_ok": "succeeded", "pm_card_declined": "failed", "pm_card_3ds": "requires_action",
           "pm_card_no_webhook": "processing"}


class FakePsp:
    """The PSP client's four calls; `charges` counts captures per Idempotency-Key."""

    def __init__(self):
        self.intents: dict[str, dict] = {}
        self.by_key: dict[str, str] = {}
        self.refunds: dict[str, dict] = {}
        self.charges: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.unavailable: dict[str, int] = Counter()
        self.refusing: dict[str, int] = Counter()  # op -> how many more calls the PSP refuses (4xx)

    def _enter(self, op: str) -> None:
        self.calls[op] += 1
        if self.unavailable[op] > 0:
            self.unavailable[op] -= 1
            raise PspUnavailable(f"fake PSP down for {op}")

    async def create_intent(self, key: str, body: dict) -> dict:
        self._enter("create")
        if key in self.by_key:
            return dict(self.intents[self.by_key[key]])
        pi = f"pi_{secrets.token_hex(8)}"
        status = INITIAL[body["payment_method"]]
        intent = {"id": pi, "object": "payment_intent", "status": status, "amount": body["amount"],
                  "currency": body["currency"], "metadata": body["metadata"], "client_secret": f"{pi}_secret",
                  "next_action": None, "last_payment_error": None, "key": key}
        if status == "requires_action":
            intent["next_action"] = {"redirect_url": f"https://psp.example/3ds/{pi}"}
        if status == "failed":
            intent["last_payment_error"] = {"code": "card_declined"}
        if status == "succeeded":
            self.charges[key] += 1
        self.intents[pi] = intent
        self.by_key[key] = pi
        return dict(intent)

    def complete(self, pi: str, status: str = "succeeded") -> dict:
        """The customer finished 3-D Secure (or a processing charge settled)."""
        intent = self.intents[pi]
        assert intent["status"] in ("requires_action", "processing")
        intent["status"], intent["next_action"] = status, None
        if status == "succeeded":
            self.charges[intent["key"]] += 1
        return dict(intent)

    async def get_intent(self, pi: str) -> dict:
        self._enter("get")
        return dict(self.intents[pi])

    async def cancel_intent(self, pi: str) -> dict:
        self._enter("cancel")
        intent = self.intents[pi]
        if intent["status"] in ("succeeded", "failed"):
            raise PspError(409, {"code": "payment_intent_unexpected_state", "payment_intent": dict(intent)})
        intent["status"], intent["next_action"] = "canceled", None
        return dict(intent)

    async def create_refund(self, key: str, pi: str, metadata: dict) -> dict:
        self._enter("refund")
        if self.refusing["refund"] > 0:
            self.refusing["refund"] -= 1
            raise PspError(400, {"code": "refund_refused_by_bank"})
        if key in self.refunds:
            return dict(self.refunds[key])
        intent = self.intents[pi]
        if intent["status"] != "succeeded":
            raise PspError(400, {"code": "payment_intent_unexpected_state"})
        refund = {"id": f"re_{secrets.token_hex(8)}", "object": "refund", "payment_intent": pi,
                  "amount": intent["amount"], "status": "succeeded"}
        self.refunds[key] = refund
        return dict(refund)

    async def aclose(self) -> None:
        pass
