"""One LISTEN loop for every service: a pooled connection held while it listens on a channel, and
one behaviour when the database goes away.

A notification is delivered only while the listening connection lives. Whoever keeps state that a
NOTIFY invalidates (a cache, a sleeping worker) must therefore treat "not listening" as "may have
missed one": `on_listening(True)` is called once the LISTEN is in place, `on_listening(False)` as
soon as the connection is lost (or cannot be had), before the loop tries again after `retry`
seconds. Bounded: one connection, one task, a fixed retry interval.

A connection lost without a FIN (a dead peer, a dropped route) sends no termination: a listener
given `tick` runs it on the listening connection once listening starts and then every `every`
seconds (`tick(conn)`: a statement the caller wants run periodically anyway, or a plain SELECT), and
a tick that fails or takes longer than `every` counts as a lost connection.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

import asyncpg

from .periodic import TRANSIENT
from .telemetry import quiet

log = logging.getLogger(__name__)


async def listen(pool: asyncpg.Pool, channel: str, on_notify: Callable[[str], None], *,
                 on_listening: Callable[[bool], None] = lambda _up: None, retry: float = 1.0,
                 tick: Callable[[asyncpg.Connection], Awaitable[object]] | None = None,
                 every: float = 10.0) -> None:
    """Forever: LISTEN on `channel` with a connection of `pool`, calling `on_notify(payload)` for each
    notification; on a lost connection, `on_listening(False)`, wait `retry` seconds, listen again.
    With `tick`: `await tick(conn)` on the listening connection first and then every `every` seconds."""
    while True:
        lost = asyncio.Event()
        try:
            with quiet():
                conn = await pool.acquire()
        except (*TRANSIENT, asyncio.TimeoutError) as e:
            log.warning("cannot listen on %s; retrying", channel, extra={"error": type(e).__name__})
            on_listening(False)
            await asyncio.sleep(retry)
            continue
        def terminated(_conn) -> None:
            lost.set()

        def notified(_conn, _pid, _channel, payload: str) -> None:
            on_notify(payload)

        try:
            conn.add_termination_listener(terminated)
            with quiet():
                await conn.add_listener(channel, notified)
            if tick is None:
                on_listening(True)
                await lost.wait()
            else:
                await _ticking(conn, lost, tick, every, on_listening)
            log.warning("listening connection on %s lost; listening again", channel)
        except (*TRANSIENT, TimeoutError) as e:
            log.warning("listening on %s failed; retrying", channel, extra={"error": type(e).__name__})
        finally:
            on_listening(False)
            with contextlib.suppress(Exception):
                conn.remove_termination_listener(terminated)
                if not conn.is_closed():
                    await conn.remove_listener(channel, notified)
            with contextlib.suppress(Exception):
                await pool.release(conn)
        await asyncio.sleep(retry)


async def _ticking(conn: asyncpg.Connection, lost: asyncio.Event,
                   tick: Callable[[asyncpg.Connection], Awaitable[object]], every: float,
                   on_listening: Callable[[bool], None]) -> None:
    """Run `tick` on the listening connection now and every `every` seconds until it is lost.
    (asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that lands as
    the awaited thing finishes, and a loop that swallowed one never stops.)"""
    with quiet():
        async with asyncio.timeout(every):
            await tick(conn)
    on_listening(True)
    while not lost.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every):
                await lost.wait()
        if not lost.is_set():
            with quiet():
                async with asyncio.timeout(every):
                    await tick(conn)
