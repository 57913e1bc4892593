"""The reservation sweeper: releases reservations older than CUTY_CODE_RESERVATION_TTL_SECONDS."""
from __future__ import annotations

import logging
import time

from cutylib.periodic import periodic
from cutylib.telemetry import quiet, record_background

from .service import ReservationService

log = logging.getLogger("codepool.sweeper")

# Reservations released per transaction (CUTY_CODE_SWEEP_BATCH). The release is one statement whose
# cost is its batch (reservations, deliveries, codes with their counters, audit entries): 100 keeps
# it well under 100 ms on a loaded 2-core machine (500 took 360-390 ms), and the round's loop runs
# batches back to back, so releases per second stay those of the larger batch (docs/benchmarks.md).
SWEEP_BATCH_DEFAULT = 100


class Sweeper:
    """Every `interval` seconds, expire due reservations in batches until none is left.

    Any number of replicas may run one: each batch is claimed with SKIP LOCKED (see
    ReservationService.expire_due), so they share the work instead of repeating it.
    """

    def __init__(self, reservations: ReservationService, interval: float, *, batch: int = SWEEP_BATCH_DEFAULT):
        self.reservations = reservations
        self.interval = interval
        self.batch = batch
        self.expired_total = 0

    async def sweep_once(self) -> int:
        total = 0
        t0 = time.time_ns()
        with quiet():  # an idle round starts no trace
            while True:
                n = await self.reservations.expire_due(self.batch)
                total += n
                if n < self.batch:
                    break
        if total:
            record_background("codepool.sweep", t0, **{"cuty.reservations.expired": total})
        self.expired_total += total
        return total

    async def run(self) -> None:
        await periodic(self.sweep_once, self.interval, what="reservation sweep", log=log)
