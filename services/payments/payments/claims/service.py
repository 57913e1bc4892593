"""An admin's resolution of a claim on a delivered code (docs/payments.md, "Code claims").

The claim lives in the code pool (docs/codepool.md, "Claims"); the orchestrator drives its
resolution because a replacement is a delivery and a refund moves money, both the orchestrator's
alone. Each step is idempotent where it happens, so a retried request, a crash at any point and the
background finisher all converge on one outcome:

- replace / reject: one SettleCodeClaim of the code pool, decided there in one transaction (the
  claim row locked, the new code taken with SKIP LOCKED); a replay answers the claim as it is.
- refund: SettleCodeClaim(REFUND) moves the claim open -> refunding (no other resolution can follow,
  the amount is one code's price), then the payment's refund machinery (PaymentsCore.issue_refund)
  refunds it under the key `claim:<claim id>#<attempt>`, so asking again never refunds twice; then
  SettleCodeClaim(REFUNDED) revokes the code. A PSP without an answer leaves the refund pending and
  the claim refunding: the finisher (`finish_pending`, every CUTY_CLAIM_REFUND_POLL_SECONDS) or a retry finishes both. A refund refused (by the PSP,
  or because staff refunded the payment meanwhile) reopens the claim.
"""
from __future__ import annotations

import logging
import uuid

import asyncpg

from cuty.codepool.v1 import claims_pb2 as cpb
from cutylib import crash, principal, tenancy
from cutylib.config import env_float
from cutylib.errors import FailedPrecondition, NotFound, Unavailable
from cutylib.principal import Principal
from cutylib.telemetry import quiet


log = logging.getLogger("payments.claims")

REPLACE, REFUND, REJECT = "replace", "refund", "reject"
STEP = {REPLACE: cpb.SETTLE_STEP_REPLACE, REJECT: cpb.SETTLE_STEP_REJECT}
MAX_REASON = 500

CHECKOUT_OF_ORDER = "SELECT payment_id, merchant_id, kind FROM checkouts WHERE id = $1 AND merchant_id = $2"


def refund_key(claim: cpb.CodeClaim) -> str:
    return f"claim:{claim.id}#{claim.refund_attempt}"


def refund_reason(claim: cpb.CodeClaim) -> str:
    return f"code claim {claim.id}: {claim.reason}"[:MAX_REASON]


class ClaimResolver:
    """`stub`: a cuty.codepool.v1 CodeClaimServiceStub; `core`: the PaymentsCore (refunds)."""

    def __init__(self, pool: asyncpg.Pool, core, stub, *, finish_every: float | None = None):
        self.pool = pool
        self.core = core
        self.stub = stub
        self.finish_every = finish_every if finish_every is not None else env_float(
            "CUTY_CLAIM_REFUND_POLL_SECONDS", 30.0)

    async def resolve(self, caller: Principal, claim_id: str, resolution: str, note: str,
                      actor: str) -> cpb.CodeClaim:
        # The admin's merchant decides what exists: another merchant's claim is NOT_FOUND, as a
        # missing one. The orchestrator reads the claim as itself (users reach a service only from
        # the gateway) and compares its merchant, which never changes.
        merchant = tenancy.merchant_filter(caller)
        with principal.acting_as(principal.SYSTEM):
            seen = await self.stub.GetCodeClaim(cpb.GetCodeClaimRequest(claim_id=claim_id))
            if merchant is not None and seen.merchant_id != merchant:
                raise NotFound(f"claim {claim_id} not found")
            if resolution in STEP:
                return await self._settle(seen.id, STEP[resolution], actor, note)
            claim = await self._settle(seen.id, cpb.SETTLE_STEP_REFUND, actor, note)
            return await self.finish_refund(claim)

    async def _settle(self, claim_id: str, step, actor: str, note: str = "", refund_id: str = "") -> cpb.CodeClaim:
        # Crash points of the crash matrix (tests/e2e/checkout/test_checkout_e2e_claim_crash_matrix.py):
        # before the code pool decides the step, and after it did but before anything else is recorded.
        crash.point("claim_settle:before")
        claim = await self.stub.SettleCodeClaim(cpb.SettleCodeClaimRequest(
            claim_id=claim_id, step=step, actor=actor, note=note, refund_id=refund_id))
        crash.point("claim_settle:after")
        return claim

    async def finish_refund(self, claim: cpb.CodeClaim) -> cpb.CodeClaim:
        """Refund a `refunding` claim's code and record it (idempotent: the refund's key is the claim's
        attempt). Returns the claim as it ends: refunded, still refunding (the PSP did not answer), or
        raises the refusal after reopening it."""
        if claim.status != cpb.CLAIM_STATUS_REFUNDING:
            return claim
        checkout = await self.pool.fetchrow(CHECKOUT_OF_ORDER, uuid.UUID(claim.checkout_id), claim.merchant_id)
        if checkout is None or checkout["payment_id"] is None:
            raise NotFound(f"no paid checkout {claim.checkout_id} for claim {claim.id}")
        try:
            refund = await self.core.issue_refund(
                claim.merchant_id, str(checkout["payment_id"]), refund_key(claim),
                amount_minor=claim.refund.amount_minor, currency=claim.refund.currency_code,
                reason=refund_reason(claim), actor=claim.resolved_by or "system:claims", codes_delivered_ok=True,
                note=f"refund of code {claim.code_id} for claim {claim.id}, decided by {claim.resolved_by}")
        except Unavailable:
            log.warning("claim refund pending at the PSP", extra={"claim_id": claim.id})
            return claim
        except FailedPrecondition as e:
            await self._settle(claim.id, cpb.SETTLE_STEP_REOPEN, "system:claims",
                               note=f"refund refused: {e.reason or 'refused'}")
            log.warning("claim refund refused; claim reopened", extra={"claim_id": claim.id, "reason": e.reason})
            raise
        if refund.status != "succeeded":
            return claim
        return await self._settle(claim.id, cpb.SETTLE_STEP_REFUNDED, claim.resolved_by or "system:claims",
                                  refund_id=refund.id)

    async def finish_pending(self, limit: int = 50) -> int:
        """One round of the finisher: every merchant's claims left refunding (a PSP timeout, a crash
        between the steps) are finished. How many were looked at."""
        with quiet(), principal.acting_as(principal.SYSTEM):
            page = await self.stub.ListCodeClaims(cpb.ListCodeClaimsRequest(
                status=cpb.CLAIM_STATUS_REFUNDING, all_merchants=True, page_size=limit))
            for claim in page.claims:
                try:
                    await self.finish_refund(claim)
                except (FailedPrecondition, NotFound) as e:
                    log.warning("claim refund not finished", extra={"claim_id": claim.id, "error": str(e)})
        return len(page.claims)
