"""cutylib.periodic: a round's retryable failure is retried; a cancelled task ends, even when a
library turned the cancellation into a retryable error (then a server's stop would wait forever)."""
import asyncio
import logging

import pytest

from cutylib.periodic import periodic

log = logging.getLogger("test")


async def test_a_retryable_failure_is_retried_next_round():
    rounds = []

    async def round_():
        rounds.append(1)
        if len(rounds) == 1:
            raise OSError("database away")
        if len(rounds) == 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(periodic(round_, 0.01, what="test", log=log), 5)
    assert len(rounds) == 3


async def test_a_cancellation_turned_into_a_retryable_error_still_ends_the_task():
    started = asyncio.Event()
    cancels = 0

    async def round_():
        nonlocal cancels
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancels += 1
            if cancels == 1:
                raise OSError("connection closed")  # what a client library may raise instead
            raise

    task = asyncio.create_task(periodic(round_, 0.01, what="test", log=log))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    if task not in done:  # the bug: clean up (a second cancel propagates) and fail
        task.cancel()
        await asyncio.wait([task], timeout=5)
        pytest.fail("the periodic task swallowed its cancellation")
    assert task.cancelled()
    assert cancels == 1
