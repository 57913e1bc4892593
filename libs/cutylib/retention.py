"""Retention of the append-only, time-partitioned tables (docs/architecture.md, "Retention").

Each such table is PARTITIONED BY RANGE on its time column, in partitions PARTITION_DAYS wide
(the database functions libs/cutylib/migrations/functions/cuty_partition*.sql). One job per
service (`Retention.run`, on cutylib.periodic), every CUTY_RETENTION_INTERVAL_SECONDS:

1. creates the partitions ahead (the current one and PARTITIONS_AHEAD more), so an insert always
   finds its partition (cuty_partitions_ahead);
2. detaches the partitions whose rows are all older than the table's retention,
   CUTY_<TABLE>_RETENTION_DAYS (0: kept forever), whole: no row is deleted, so the append-only
   triggers stay as they are (cuty_partitions_detach);
3. with CUTY_RETENTION_ARCHIVE_DIR set, writes each detached partition to
   `<dir>/<table>/<partition>.csv` (COPY, with a header; written to a temporary name, fsynced,
   then renamed, so a file there is whole) before dropping it (cuty_partition_drop). A crash
   between the steps leaves a detached table the next round finds, archives and drops.

Every statement is bounded: the DETACH waits at most LOCK_TIMEOUT_MS for its lock (a round that
cannot get it skips and the next retries), and a round touches at most the table's partitions.
The rounds of several replicas are harmless: creating and detaching are idempotent, and an
archive is keyed by the partition's name.
"""
from __future__ import annotations

import logging
import os
import pathlib
from dataclasses import dataclass

from .config import env_float, env_int, env_str
from .periodic import periodic

log = logging.getLogger(__name__)

PARTITION_DAYS = 30
PARTITIONS_AHEAD = 2
LOCK_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class Table:
    """A partitioned table and how long its rows are kept (0: forever)."""
    name: str
    retention_days: int


def table(name: str, default_days: int) -> Table:
    """`name` with its retention from CUTY_<NAME>_RETENTION_DAYS (default `default_days`)."""
    days = env_int(f"CUTY_{name.upper()}_RETENTION_DAYS", default_days)
    if days < 0:
        raise ValueError(f"CUTY_{name.upper()}_RETENTION_DAYS must be >= 0 (0: kept forever)")
    return Table(name, days)


def archive_dir() -> pathlib.Path | None:
    d = env_str("CUTY_RETENTION_ARCHIVE_DIR", "")
    return pathlib.Path(d) if d else None


def interval_seconds() -> float:
    return env_float("CUTY_RETENTION_INTERVAL_SECONDS", 3600.0)


@dataclass
class Round:
    created: list[str]
    detached: list[str]
    archived: list[pathlib.Path]
    dropped: list[str]


class Retention:
    def __init__(self, pool, tables: list[Table], archive: pathlib.Path | None = None):
        self.pool, self.tables, self.archive = pool, tables, archive

    async def round(self) -> Round:
        done = Round([], [], [], [])
        for t in self.tables:
            done.created += await self.pool.fetchval(
                "SELECT coalesce(array_agg(p), '{}') FROM cuty_partitions_ahead($1, $2, $3) p",
                t.name, PARTITION_DAYS, PARTITIONS_AHEAD)
            if t.retention_days == 0:
                continue
            detached = await self.pool.fetchval(
                "SELECT coalesce(array_agg(p), '{}') FROM cuty_partitions_detach($1, "
                "clock_timestamp() - make_interval(days => $2), $3) p", t.name, t.retention_days, LOCK_TIMEOUT_MS)
            done.detached += detached
            for name in detached:
                if self.archive is not None:
                    done.archived.append(await self._archive(t.name, name))
                await self.pool.execute("SELECT cuty_partition_drop($1, $2)", t.name, name)
                done.dropped.append(name)
        if done.created or done.dropped:
            log.info("retention round", extra={"created": done.created, "dropped": done.dropped,
                                               "archived": [str(p) for p in done.archived]})
        return done

    async def _archive(self, parent: str, name: str) -> pathlib.Path:
        folder = self.archive / parent
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.csv"
        partial = folder / f".{name}.csv.partial"
        async with self.pool.acquire() as conn:
            with open(partial, "wb") as f:
                await conn.copy_from_table(name, output=f, format="csv", header=True)
                f.flush()
                os.fsync(f.fileno())
        os.replace(partial, path)
        return path

    async def run(self, interval: float | None = None) -> None:
        await periodic(self.round, interval or interval_seconds(), what="partition retention", log=log)
