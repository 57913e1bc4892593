"""The PSP's contract as its clients see it: the calls (`Psp`) and the two ways one can end
without an answer to use (`PspError`: refused, `PspUnavailable`: unknown).

The payments service's HTTP client (payments/psp.py) and the tests' in-memory stand-in
(cutylib.testing.fake_psp) both implement `Psp`, so neither imports the other and cutylib never
imports a service. docs/pspsim.md describes the simulator behind it.
"""
from __future__ import annotations

from typing import Any, Protocol


class PspError(Exception):
    """A definitive 4xx answer: the PSP understood the request and refused it."""

    def __init__(self, status: int, error: dict[str, Any]):
        super().__init__(f"PSP answered {status}: {error.get('code', '')}: {error.get('message', '')}")
        self.status = status
        self.error = error
        self.code = str(error.get("code", ""))

    @property
    def payment_intent(self) -> dict[str, Any] | None:
        """The intent the PSP attaches to a wrong-state refusal (e.g. cancel of a succeeded intent)."""
        pi = self.error.get("payment_intent")
        return pi if isinstance(pi, dict) else None


class PspUnavailable(Exception):
    """No definitive answer (timeouts, 5xx, connection errors after retries): outcome unknown."""


class Psp(Protocol):
    """Stripe-like payment intents and refunds. Creates and refunds carry an Idempotency-Key: the
    same key answers the same object, so a repeat never charges or refunds twice."""

    async def create_intent(self, idempotency_key: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def get_intent(self, intent_id: str) -> dict[str, Any]: ...

    async def cancel_intent(self, intent_id: str) -> dict[str, Any]: ...

    async def create_refund(self, idempotency_key: str, intent_id: str, metadata: dict[str, str],
                            amount: int | None = None) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...
