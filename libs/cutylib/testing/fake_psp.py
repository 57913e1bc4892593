"""One in-memory stand-in for the PSP client (`cutylib.psp.Psp`, as payments.psp.PspClient), for
in-process tests that need deterministic PSP answers: the payments core's and the checkout saga's.
The e2e tests use the real simulator process (services/pspsim). It raises the contract's own
PspError / PspUnavailable; no service imports it.

    psp = FakePsp()
    psp.unavailable["create"] = 2     # the next two creates answer "unknown" (a timeout)
    psp.refusing["refund"] = 1        # the next refund is refused (4xx)
    psp.unavailable["refund-answer"] = 1  # the next refund happens but its answer is lost
    psp.set_status(intent_id, "succeeded")   # the customer finished 3-D Secure, or a charge settled
    psp.charges[key]                  # captures per Idempotency-Key (never more than one)
    psp.declining_off_session = True  # off-session charges on saved cards are declined
"""
from __future__ import annotations

import secrets
from collections import Counter
from typing import Any

from cutylib.psp import PspError, PspUnavailable

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
        self.unavailable: Counter[str] = Counter()  # op -> how many more calls answer "unknown"
        self.refusing: Counter[str] = Counter()  # op -> how many more calls the PSP refuses (4xx)
        self.saved: dict[str, str] = {}  # saved payment method -> its customer (setup_future_usage)
        self.declining_off_session = False

    def _enter(self, op: str) -> None:
        self.calls[op] += 1
        if self.unavailable[op] > 0:
            self.unavailable[op] -= 1
            raise PspUnavailable(f"fake PSP down for {op}")

    async def create_intent(self, idempotency_key: str, body: dict[str, Any]) -> dict[str, Any]:
        self._enter("create")
        if idempotency_key in self.by_key:
            return dict(self.intents[self.by_key[idempotency_key]])
        off_session = body.get("off_session") is True
        if off_session:  # a saved card, charged without the customer (declined while declining_off_session)
            if self.saved.get(body["payment_method"]) != body.get("customer"):
                raise PspError(404, {"code": "resource_missing", "message": "no such saved payment_method"})
            status = "failed" if self.declining_off_session else "succeeded"
        elif body["payment_method"] not in INITIAL:
            raise PspError(400, {"code": "payment_method_unknown", "message": "unknown"})
        else:
            status = INITIAL[body["payment_method"]]
        pi = f"pi_{secrets.token_hex(8)}"
        intent = {"id": pi, "object": "payment_intent", "status": status, "amount": body["amount"],
                  "amount_refunded": 0, "currency": body["currency"], "metadata": body["metadata"],
                  "client_secret": f"{pi}_secret_x", "next_action": None, "last_payment_error": None}
        if status == "requires_action":
            intent["next_action"] = {"redirect_url": f"https://psp.example/3ds/{pi}"}
        if status == "failed":
            intent["last_payment_error"] = {"code": "card_declined"}
        if status == "succeeded":
            self.charges[idempotency_key] += 1
            if body.get("setup_future_usage") == "off_session":  # the card saved for off-session use
                saved, customer = f"pm_saved_{secrets.token_hex(6)}", f"cus_{secrets.token_hex(6)}"
                self.saved[saved] = customer
                intent.update(customer=customer, saved_payment_method=saved)
        self.intents[pi] = intent
        self.by_key[idempotency_key] = pi
        return dict(intent)

    def set_status(self, pi: str, status: str = "succeeded") -> dict[str, Any]:
        """The intent moves at the PSP (the customer finished 3-D Secure, a charge settled...)."""
        intent = self.intents[pi]
        if status == "succeeded" and intent["status"] != "succeeded":
            self.charges[[k for k, v in self.by_key.items() if v == pi][0]] += 1
        intent["status"] = status
        if status != "requires_action":
            intent["next_action"] = None
        return dict(intent)

    async def get_intent(self, intent_id: str) -> dict[str, Any]:
        self._enter("get")
        return dict(self.intents[intent_id])

    async def cancel_intent(self, intent_id: str) -> dict[str, Any]:
        self._enter("cancel")
        intent = self.intents[intent_id]
        if intent["status"] in ("succeeded", "failed"):
            raise PspError(409, {"code": "payment_intent_unexpected_state", "payment_intent": dict(intent)})
        return self.set_status(intent_id, "canceled")

    async def create_refund(self, idempotency_key: str, intent_id: str, metadata: dict[str, str],
                            amount: int | None = None) -> dict[str, Any]:
        """As the simulator: `amount` None refunds what is left; never more than captured in total."""
        self._enter("refund")
        if self.refusing["refund"] > 0:
            self.refusing["refund"] -= 1
            raise PspError(400, {"code": "refund_refused_by_bank"})
        if idempotency_key in self.refunds:
            return dict(self.refunds[idempotency_key])
        intent = self.intents[intent_id]
        if intent["status"] != "succeeded":
            raise PspError(400, {"code": "payment_intent_unexpected_state"})
        left = intent["amount"] - intent["amount_refunded"]
        if left <= 0:
            raise PspError(400, {"code": "charge_already_refunded"})
        amount = left if amount is None else amount
        if amount > left:
            raise PspError(400, {"code": "amount_too_large"})
        intent["amount_refunded"] += amount
        refund = {"id": f"re_{secrets.token_hex(8)}", "object": "refund", "payment_intent": intent_id,
                  "amount": amount, "status": "succeeded", "metadata": metadata}
        self.refunds[idempotency_key] = refund
        if self.unavailable["refund-answer"] > 0:  # refunded, but the answer is lost (a timeout)
            self.unavailable["refund-answer"] -= 1
            raise PspUnavailable("fake PSP: refund answer lost")
        return dict(refund)

    def refunded(self, intent_id: str) -> int:
        """What the PSP refunded of the intent, in minor units."""
        return sum(r["amount"] for r in self.refunds.values() if r["payment_intent"] == intent_id)

    async def list_disputes(self, updated_gte: float, *, starting_after: str = "", limit: int = 100) -> dict:
        """The dispute poller's list: this stand-in opens no disputes (the simulator's scenarios do),
        so its list is empty, as a PSP's is for a platform without any."""
        self._enter("list_disputes")
        return {"object": "list", "data": [], "has_more": False}

    async def aclose(self) -> None:
        pass
