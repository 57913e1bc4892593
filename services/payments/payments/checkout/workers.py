"""Saga workers: claim due sagas (FOR UPDATE SKIP LOCKED + lease) and drive them.

Any number of replicas run this loop against one database. A saga is due when its next_run_at has
passed: a wake-up from a payment change (the payments trigger payments_wake_checkout, which also NOTIFYs
every replica on commit), a hold running out, a retry's backoff ending, or a lease left behind by a crashed
process. Polling every CUTY_SAGA_POLL_SECONDS is only the safety net under NOTIFY.

The NOTIFY is heard on one pooled connection per replica (cutylib.listen). When that connection is
lost, the worker may have missed a wake-up: it claims at once, on the loss and again once listening,
so what was committed meanwhile is found without waiting for the next poll.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from cutylib.listen import listen
from cutylib.telemetry import quiet

from . import repository as repo
from .engine import TRANSIENT, Engine
from .remote import Refused, Rejected
from .settings import CheckoutOptions

log = logging.getLogger(__name__)


class SagaWorker:
    def __init__(self, pool: asyncpg.Pool, engine: Engine, options: CheckoutOptions,
                 lease_seconds: float, worker_id: str):
        self.pool = pool
        self.sagas = repo.Sagas(pool)
        self.engine = engine
        self.options = options
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._running: set[asyncio.Task] = set()

    async def run(self) -> None:
        """The background task (GrpcServer.add_background): listen, claim, drive, forever."""
        listener = asyncio.create_task(listen(self.pool, repo.WAKE_CHANNEL, self._notified,
                                              on_listening=self._listening))
        try:
            while True:
                # Cleared before claiming: a NOTIFY that lands while we claim keeps it set, so the
                # wait below returns at once instead of sleeping through that wake-up.
                self._wake.clear()
                claimed = await self.claim_and_start()
                if claimed < self.options.batch_size:
                    # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the cancellation
                    # that stops the worker when a wake-up lands at the same moment.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.options.poll_seconds):
                            await self._wake.wait()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            await self.drain()

    def _notified(self, _payload: str) -> None:
        self._wake.set()

    def _listening(self, _up: bool) -> None:
        # Lost, or listening again: a wake-up may have been missed meanwhile, so claim now.
        self._wake.set()

    async def claim_and_start(self) -> int:
        """Claim up to as many due sagas as there are free driving slots and start driving them.
        Returns how many were claimed, or batch_size when all slots are busy (look again soon)."""
        free = min(self.options.batch_size, self.options.concurrency - len(self._running))
        if free <= 0:
            self._slot_freed.clear()
            await self._slot_freed.wait()
            return self.options.batch_size
        try:
            with quiet():  # polling starts no trace; each saga's drive continues its own
                sagas = await self.sagas.claim_due(self.worker_id, free, self.lease_seconds)
        except TRANSIENT:
            log.warning("saga claim failed; retrying", exc_info=True)
            await asyncio.sleep(self.options.poll_seconds)
            return 0
        for saga in sagas:
            task = asyncio.create_task(self._drive(saga))
            self._running.add(task)
            task.add_done_callback(self._done)
        return len(sagas)

    def _done(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._slot_freed.set()

    async def _drive(self, saga) -> None:
        try:
            await self.engine.drive(saga, saga.lease_owner)
        except Rejected:
            pass  # recorded as REJECTED by the engine
        except Refused as ref:
            await self.engine.reject(saga, saga.lease_owner, ref.error.reason or type(ref.error).__name__)
        except Exception:  # noqa: BLE001 - the lease expires and another round retries
            log.exception("saga drive failed", extra={"checkout_id": saga.id})

    async def drain(self) -> None:
        for t in list(self._running):
            t.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
