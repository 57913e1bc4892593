"""The hold sweeper: marks expired holds 'expired'.

Correctness never waits for it (HoldSlot and ConfirmHold retire overlapping expired holds
themselves); it keeps the 'held' rows, the per-customer cap's index and the exclusion index small,
and makes statuses read true to anyone querying the table. Any number of replicas may run it at
once: SKIP LOCKED hands each a disjoint batch (repository.SWEEP_EXPIRED).
"""
from __future__ import annotations

import logging
import time
import uuid

import asyncpg

from cutylib.periodic import periodic
from cutylib.telemetry import quiet, record_background

from . import metrics
from .repository import Holds

log = logging.getLogger(__name__)

SWEEP_BATCH = 500


class Sweeper:
    def __init__(self, pool: asyncpg.Pool, interval_seconds: float, *, batch: int = SWEEP_BATCH):
        self.holds = Holds(pool)
        self.interval = interval_seconds
        self.batch = batch

    async def sweep_once(self) -> list[uuid.UUID]:
        """Expire every hold that is due now, batch by batch (one short transaction each, so a big
        backlog never holds many row locks at once). Returns the ids this sweeper expired."""
        swept: list[uuid.UUID] = []
        t0 = time.time_ns()
        with quiet():  # an idle round starts no trace
            while True:
                ids = await self.holds.sweep(self.batch)
                swept.extend(ids)
                if len(ids) < self.batch:
                    break
        metrics.REGISTRY.sweeps.inc()
        if swept:
            metrics.REGISTRY.holds_swept.inc(len(swept))
            record_background("booking.sweep", t0, **{"cuty.holds.swept": len(swept)})
            log.info("expired holds swept", extra={"swept": len(swept)})
        return swept

    async def run(self) -> None:
        """Forever, every `interval` seconds. A database outage is logged and retried next round."""
        await periodic(self.sweep_once, self.interval, what="hold sweep", log=log)
