"""Reconciliation: ask the PSP about every payment non-terminal for longer than
CUTY_RECONCILE_AFTER_SECONDS and finalize what it says, so a lost webhook never strands money.

Replicas are safe together: a claim is `FOR UPDATE SKIP LOCKED` plus the payment's lease, taken in
one statement (repository.CLAIM_RECONCILE); the next attempt backs off exponentially.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from opentelemetry import trace

from . import domain
from cutylib.telemetry import quiet

from .service import PaymentsCore
from .domain import Outcome
from .psp import PspError, PspUnavailable
from .views import PaymentView

log = logging.getLogger(__name__)
tracer = trace.get_tracer("cuty.payments.reconcile")


class Reconciler:
    def __init__(self, core: PaymentsCore):
        self.core = core

    async def run(self) -> None:
        """Worker loop: drain due payments, then poll."""
        while True:
            if await self.run_once() == 0:
                await asyncio.sleep(self.core.options.poll_seconds)

    async def run_once(self) -> int:
        core = self.core
        with quiet():  # polling starts no trace; each payment reconciled gets its own span
            claimed = await core.rows.claim_reconcile(core.options.batch_size, core.worker_id,
                                                      core.settings.lease_seconds, core.settings.reconcile_after_seconds)
        if claimed:
            await asyncio.gather(*(self._one(view, previous_owner) for view, previous_owner in claimed))
        # Issue 12: refunds left pending (a PSP timeout, a crash around the PSP call) are asked again
        # with the same key once they are as old as a payment would be.
        with quiet():
            refunds = await core.finish_pending_refunds(float(core.settings.reconcile_after_seconds),
                                                        core.options.batch_size)
        return len(claimed) + refunds

    async def _one(self, view: PaymentView, previous_owner: str | None) -> None:
        core = self.core
        core._note_takeover(view.id, previous_owner)
        with tracer.start_as_current_span("payments.reconcile", attributes={"cuty.payment.id": view.id}):
            try:
                try:
                    intent = await core.ask_psp(view)
                except PspError as exc:
                    if view.psp_intent_id is None and exc.status in (400, 402, 404):
                        # The replayed create was refused: nothing was charged.
                        await self._finalize(view, domain.FAILED, {"last_payment_error": {"code": exc.code}})
                    else:
                        log.error("PSP refused reconciliation", extra={"payment_id": view.id, "error": str(exc)})
                    return
                await self._finalize(view, domain.status_of_intent(intent), intent)
            except PspUnavailable as exc:
                log.warning("PSP unavailable during reconciliation; will retry",
                            extra={"payment_id": view.id, "error": str(exc)})
            except Exception:  # noqa: BLE001 - one bad payment must not stop the others
                log.exception("reconciliation failed", extra={"payment_id": view.id})
            finally:
                await core.release_lease(view.id)

    async def _finalize(self, view: PaymentView, observed: str, intent: dict[str, Any]) -> None:
        after, outcome = await self.core.finalize_outcome(view.id, observed, "reconcile", intent=intent,
                                                          note=f"reconciled with the PSP by {self.core.worker_id}",
                                                          leased=True)
        if outcome is Outcome.APPLY:
            self.core.metrics.reconciled.inc()
            log.info("payment reconciled", extra={"payment_id": view.id, "from": view.status, "to": after.status})
