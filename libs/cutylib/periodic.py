"""The loop of every periodic worker (booking's hold sweeper, the code pool's reservation sweeper,
the metrics refresh): one round now and then every `interval` seconds, forever (it was
written out per sweeper). A round that fails for a reason a later round may not have (the
database restarting, a connection killed) is logged and retried next round; anything else
propagates, so a bug stops the task loudly instead of being retried forever.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import asyncpg

# What "the database is away for a while" looks like from asyncpg.
TRANSIENT = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)


async def periodic(round_: Callable[[], Awaitable[object]], interval: float, *, what: str, log: logging.Logger,
                   retry_on: tuple[type[BaseException], ...] = TRANSIENT) -> None:
    """Await `round_()` now and every `interval` seconds (measured from each round's start)."""
    while True:
        t0 = time.monotonic()
        try:
            await round_()
        except retry_on as e:
            # A library may turn the task's cancellation into one of these (grpc's CANCELLED, a
            # connection closed under a cancelled query): the request stays pending on the task, and
            # retrying would swallow it, so a server's stop would wait forever.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError() from e
            log.warning("%s failed; retrying next round", what, extra={"error": type(e).__name__, "detail": str(e)})
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - t0)))
