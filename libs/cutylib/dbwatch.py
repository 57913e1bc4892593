"""Health that tells the truth, and a service that survives its database (docs/deploy.md).

A service starts whether or not Postgres answers: its pool is created without connecting, its gRPC
health says NOT_SERVING, and `DatabaseWatch` (a background task of the server) does, with back-off
until each succeeds: apply the migrations (unless a Job does it), check that none is pending, warm
the pool up to its minimum size; then it says SERVING and keeps probing the database once a
second. When the database goes away the health goes NOT_SERVING (Kubernetes takes the pod out of
rotation; liveness, a separate health name, stays SERVING: the process is fine), RPCs answer
UNAVAILABLE with a retry hint, workers' steps fail and are retried; when it returns, the next probe
flips health back, within about a second.
"""
from __future__ import annotations

import asyncio
import logging
import pathlib
import time

import asyncpg

from . import telemetry
from .db import migrate, pending_migrations

log = logging.getLogger(__name__)

# Errors that mean "the database is not there (yet)", as opposed to a bug.
UNREACHABLE = (OSError, ConnectionError, asyncio.TimeoutError, asyncpg.exceptions.CannotConnectNowError,
               asyncpg.exceptions.ConnectionDoesNotExistError, asyncpg.exceptions.AdminShutdownError,
               asyncpg.exceptions.ConnectionFailureError, asyncpg.exceptions.InterfaceError,
               asyncpg.exceptions.TooManyConnectionsError, asyncpg.exceptions.InternalClientError)


class DatabaseWatch:
    def __init__(self, pool: asyncpg.Pool, dsn: str, migrations: pathlib.Path | None, *,
                 migrate_on_start: bool = True, warm_connections: int = 0, interval: float = 1.0,
                 probe_timeout: float = 2.0, max_backoff: float = 5.0):
        self.pool = pool
        self.dsn = dsn
        self.migrations = migrations
        # Set by GrpcServer.watch_database: its health, and the checks to run once the database answers.
        self.set_serving = None  # async fn(bool)
        self.on_ready: list = []
        self.migrate_on_start = migrate_on_start
        self.warm_connections = warm_connections
        self.interval = interval
        self.probe_timeout = probe_timeout
        self.max_backoff = max_backoff
        self.up = False
        self.ready = asyncio.Event()  # migrations done once; set for good

    async def run(self) -> None:
        # Probes and warm-up are background polling: they start no trace.
        with telemetry.quiet():
            await self._prepare()
            while True:
                await self._probe()
                await asyncio.sleep(self.interval)

    async def _prepare(self) -> None:
        """Migrate (or wait for the Job to), then warm the pool, retrying with back-off."""
        delay, started = 0.2, time.monotonic()
        while True:
            try:
                if self.migrations is not None:
                    if self.migrate_on_start:
                        await migrate(self.dsn, self.migrations)
                    else:
                        pending = await pending_migrations(self.dsn, self.migrations)
                        if pending:
                            raise _Pending(pending)
                await self._warm()
                for fn in self.on_ready:  # e.g. codepool's hash-key guard; its own errors stop the process
                    await fn()
                break
            except UNREACHABLE as e:
                log.warning("database not reachable yet; retrying",
                            extra={"error": type(e).__name__, "retry_in_s": delay,
                                   "waited_s": round(time.monotonic() - started, 1)})
            except _Pending as e:
                log.warning("waiting for migrations to be applied (python -m <service> migrate)",
                            extra={"pending": ",".join(e.args[0]), "retry_in_s": delay})
            await asyncio.sleep(delay)
            delay = min(self.max_backoff, delay * 2)
        self.ready.set()

    async def _warm(self) -> None:
        n = self.warm_connections
        if n <= 0:
            return
        conns = [await self.pool.acquire(timeout=self.probe_timeout) for _ in range(n)]
        for c in conns:
            await self.pool.release(c)

    async def _probe(self) -> None:
        try:
            await self.pool.fetchval("SELECT 1", timeout=self.probe_timeout)
            up = True
        except UNREACHABLE as e:
            up, error = False, type(e).__name__
        if up != self.up:
            self.up = up
            await self.set_serving(up)
            if up:
                log.info("database reachable: SERVING")
            else:
                log.warning("database unreachable: NOT_SERVING", extra={"error": error})


class _Pending(Exception):
    pass
