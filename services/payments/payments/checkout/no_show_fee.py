"""The no-show fee's off-session charge (docs/checkout.md, "No-show fee").

The customer accepted the fee at purchase (PayCheckout's accept_no_show_fee, recorded with the
checkout by the statement that started the purchase; the PSP saved the card for off-session use).
MarkNoShow's own statement makes the fee 'due'; then one charger at a time (a lease on the checkout
row, taken by a conditional UPDATE) charges it as its own payment of the checkout, on the saved
card, with the key `no-show-fee:<checkout id>`: one payments row per key and one PSP intent per
key, so a charger that died anywhere, or two that raced, charge it once. The outcome ('charged' or
'declined') is written by a statement fenced by the lease and by the payment's amount (never more
than accepted), with its timeline event and, by trigger, its merchant event. An outcome not known
yet (the PSP unreachable, a payment still processing) leaves it 'due' for the worker's next round.

Nobody is charged for an action they did not start: only a checkout with an acceptance can become
'due' (a CHECK says so), and staff never choose the amount or the card.
"""
from __future__ import annotations

import logging
import secrets

import asyncpg

from cutylib import crash, errors
from cutylib.psp import PspUnavailable
from cutylib.periodic import periodic
from cutylib.telemetry import quiet

from ..domain import OFF_SESSION_CHARGE
from .domain import Saga
from .ports import Payments

log = logging.getLogger(__name__)

DUE, CHARGED, DECLINED = "due", "charged", "declined"
# The worker's batch (its lease is the saga's, CUTY_LEASE_SECONDS; a due fee is tried again after
# CUTY_SAGA_RETRY_CAP_SECONDS, and the worker looks every CUTY_SAGA_POLL_SECONDS).
BATCH = 20
# A fee whose charge keeps failing without an answer is given up as declined after this many attempts
# (the payment, if any, is still reconciled; the merchant gets the declined event with the reason).
MAX_ATTEMPTS = 50

_RETURNING = "RETURNING *, clock_timestamp() AS db_now"

# One charger at a time: a due fee whose lease is free (or ran out: its charger died).
CLAIM = f"""
UPDATE checkouts SET no_show_fee_lease_owner = $2,
                     no_show_fee_lease_until = clock_timestamp() + make_interval(secs => $3::float8),
                     no_show_fee_attempts = no_show_fee_attempts + 1
WHERE id = $1 AND no_show_fee_status = 'due'
  AND (no_show_fee_lease_until IS NULL OR no_show_fee_lease_until < clock_timestamp())
{_RETURNING}
"""
# The worker's round: due fees whose time came, oldest first, a batch at a time.
CLAIM_DUE = f"""
WITH due AS (
    SELECT id FROM checkouts
    WHERE no_show_fee_status = 'due' AND no_show_fee_next_at <= statement_timestamp()  -- stable: bounds the scan
      AND (no_show_fee_lease_until IS NULL OR no_show_fee_lease_until < clock_timestamp())
    ORDER BY no_show_fee_next_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE checkouts c SET no_show_fee_lease_owner = $1,
                       no_show_fee_lease_until = clock_timestamp() + make_interval(secs => $2::float8),
                       no_show_fee_attempts = c.no_show_fee_attempts + 1
FROM due WHERE c.id = due.id
RETURNING c.*, clock_timestamp() AS db_now
"""
# The outcome, by the lease's holder only, and (charged) only for a payment of this checkout of at
# most the accepted amount; with its timeline event in the same statement.
DECIDE = """
WITH upd AS (
    UPDATE checkouts c SET no_show_fee_status = $3, no_show_fee_payment_id = $4::uuid, no_show_fee_failure = $5,
                           no_show_fee_lease_owner = NULL, no_show_fee_lease_until = NULL,
                           no_show_fee_next_at = NULL, updated_at = clock_timestamp()
    WHERE c.id = $1 AND c.no_show_fee_status = 'due' AND c.no_show_fee_lease_owner = $2
      AND ($3 <> 'charged' OR EXISTS (
          SELECT 1 FROM payments p WHERE p.id = $4::uuid AND p.checkout_id = c.id
             AND p.amount_minor <= c.no_show_fee_minor AND p.currency = c.currency))
    RETURNING c.*, clock_timestamp() AS db_now
), ev AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, trace_id, note, merchant_id)
    SELECT no_show_fee_payment_id, id, 'no_show_fee', 'due', no_show_fee_status, '', $6, merchant_id FROM upd
)
SELECT * FROM upd
"""
# Not known yet: give the lease back, try again later (the payment, once known, is kept).
LATER = """
UPDATE checkouts SET no_show_fee_payment_id = COALESCE(no_show_fee_payment_id, $3::uuid), no_show_fee_failure = $4,
                     no_show_fee_lease_owner = NULL, no_show_fee_lease_until = NULL,
                     no_show_fee_next_at = clock_timestamp() + make_interval(secs => $5::float8)
WHERE id = $1 AND no_show_fee_status = 'due' AND no_show_fee_lease_owner = $2
"""


def fee_key(checkout_id: str) -> str:
    """The fee payment's idempotency key (ours and the PSP's): one per checkout, so one charge."""
    return f"no-show-fee:{checkout_id}"


class NoShowFees:
    def __init__(self, pool: asyncpg.Pool, payments: Payments, worker_id: str, *, lease_seconds: float,
                 retry_seconds: float, poll_seconds: float):
        self.pool = pool
        self.payments = payments
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.retry_seconds = retry_seconds
        self.poll_seconds = poll_seconds

    async def charge(self, checkout_id: str) -> None:
        """Charge a due fee now if no other charger holds it (MarkNoShow calls this after its commit)."""
        owner = f"no-show-fee:{secrets.token_hex(8)}"
        row = await self.pool.fetchrow(CLAIM, checkout_id, owner, self.lease_seconds)
        if row is not None:
            await self._charge(Saga.from_row(row), owner, row["no_show_fee_attempts"])

    async def run_once(self) -> int:
        """One worker round: the due fees whose time came (a charger that died, an outcome unknown)."""
        owner = f"{self.worker_id}:{secrets.token_hex(4)}"
        with quiet():  # polling starts no trace; a fee found due is charged under its own
            rows = await self.pool.fetch(CLAIM_DUE, owner, self.lease_seconds, BATCH)
        for row in rows:
            await self._charge(Saga.from_row(row), owner, row["no_show_fee_attempts"])
        return len(rows)

    async def run(self) -> None:
        await periodic(self.run_once, self.poll_seconds, what="no-show fee round", log=log)

    async def _charge(self, saga: Saga, owner: str, attempts: int) -> None:
        payment_id = saga.no_show_fee_payment_id
        try:
            crash.point("no_show_fee:before")
            card = await self.payments.saved_card(saga.payment_id) if saga.payment_id else None
            if card is None:
                await self._decide(saga, owner, DECLINED, None, "no-saved-card",
                                   "no card was saved at purchase: nothing charged")
                return
            customer, method = card
            payment = await self.payments.create_and_charge(
                checkout_id=saga.id, amount_minor=saga.no_show_fee_minor, currency=saga.currency,
                payment_method=method, idempotency_key=fee_key(saga.id), customer_id=saga.customer_id,
                merchant_id=saga.merchant_id, off_session=OFF_SESSION_CHARGE, psp_customer=customer)
            crash.point("no_show_fee:after")
            payment_id = payment.id
            if payment.status in ("succeeded", "partially_refunded", "refunded"):
                await self._decide(saga, owner, CHARGED, payment.id, None,
                                   f"no-show fee {saga.no_show_fee_minor} {saga.currency} charged off-session")
            elif payment.status in ("failed", "canceled"):
                reason = payment.failure_reason or payment.status
                await self._decide(saga, owner, DECLINED, payment.id, reason, f"no-show fee declined: {reason}")
            else:  # processing, or created after a timeout: reconciliation or a webhook settles it
                await self._later(saga, owner, payment.id, f"payment {payment.status}: outcome not known yet", attempts)
        except (PspUnavailable, errors.Unavailable) as e:
            await self._later(saga, owner, payment_id, f"PSP unavailable: {e}"[:300], attempts)
        except (errors.InvalidArgument, errors.FailedPrecondition) as e:
            # Refused before reaching the PSP (our own request is wrong): retrying cannot help.
            await self._decide(saga, owner, DECLINED, payment_id, "payment-refused", f"no-show fee refused: {e.message}")

    async def _decide(self, saga: Saga, owner: str, status: str, payment_id: str | None, failure: str | None,
                      note: str) -> None:
        row = await self.pool.fetchrow(DECIDE, saga.id, owner, status, payment_id, failure, note)
        if row is None:
            log.warning("no-show fee outcome not written (lease lost or the payment is not the fee's)",
                        extra={"checkout_id": saga.id, "status": status})
        else:
            log.info("no-show fee decided", extra={"checkout_id": saga.id, "status": status})

    async def _later(self, saga: Saga, owner: str, payment_id: str | None, why: str, attempts: int) -> None:
        if attempts >= MAX_ATTEMPTS and payment_id is None:
            await self._decide(saga, owner, DECLINED, None, "psp-unavailable",
                               f"no-show fee given up after {attempts} attempts: {why}")
            return
        await self.pool.execute(LATER, saga.id, owner, payment_id, why, self.retry_seconds)
