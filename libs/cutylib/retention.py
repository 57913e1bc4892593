"""Retention of the append-only, time-partitioned tables (docs/architecture.md, "Retention").

Each such table is PARTITIONED BY RANGE on its time column, in partitions PARTITION_DAYS wide
(a table may choose narrower ones: the idempotency keys, kept days, not months, use a day; the
database functions libs/cutylib/migrations/functions/cuty_partition*.sql). One job per
service (`Retention.run`, on cutylib.periodic), every CUTY_RETENTION_INTERVAL_SECONDS:

1. creates the partitions ahead (the current one and PARTITIONS_AHEAD more, or the table's own
   count), so an insert always finds its partition (cuty_partitions_ahead);
2. detaches the partitions whose rows are all older than the table's retention,
   CUTY_<TABLE>_RETENTION_DAYS (0: kept forever), whole: no row is deleted, so the append-only
   triggers stay as they are (cuty_partitions_detach);
3. with CUTY_RETENTION_ARCHIVE_DIR set, writes each detached partition to
   `<dir>/<table>/<partition>.csv` (COPY, with a header; written to a temporary name, fsynced,
   then renamed, so a file there is whole) before dropping it (cuty_partition_drop). A crash
   between the steps leaves a detached table the next round finds, archives and drops.

Tables whose rows change state, or that hold keys a partition cannot (a global unique key, the
target of foreign keys), are not partitioned themselves: the same round first MOVES their finished
rows, older than CUTY_<NAME>_MOVE_AFTER_DAYS, into a time-partitioned, append-only history table
(partitioned on the time of the move), in batches of MOVE_BATCH rows, at most MOVE_LIMIT a round
(CUTY_RETENTION_MOVE_BATCH / CUTY_RETENTION_MOVE_LIMIT). Each batch is one call of the table's move
function (its migrations' `<table>_move(batch, finished_before)`): it locks its rows with FOR UPDATE
SKIP LOCKED (a row a live statement holds is left for a later round), copies them into the history
and deletes them from the live table in one transaction, and the live table's delete guard
(cuty_delete_moved) refuses to let a row out that the history does not hold. The history then
leaves whole past its retention like any partitioned table above, and reads inside the retention
look in both.

Key tables (idempotency keys, the PSP's event ids) are partitioned themselves, by the time the key
was first used: their rows change only during the key's lifetime, which the retention must exceed
(`table(..., at_least_days=)`), so a partition leaves once every key in it is dead. A partitioned
table's unique keys must hold the partition key, so the uniqueness of a key across partitions is
kept by the table's own insert function (under the key's advisory lock); see each table's docs.

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
from .db import ALL_MERCHANTS, UnitOfWork
from .periodic import periodic
from .telemetry import quiet

log = logging.getLogger(__name__)

PARTITION_DAYS = 30
PARTITIONS_AHEAD = 2
LOCK_TIMEOUT_MS = 2000
# A batch of 500 is one transaction of tens of milliseconds (`make bench-growth`), so no periodic
# statement holds its locks or a connection for long; 100,000 a round, every 600 s, is ~14 M a day.
MOVE_BATCH = 500
MOVE_LIMIT = 100_000


@dataclass(frozen=True)
class Table:
    """A partitioned table and how long its rows are kept (0: forever), in partitions `width_days`
    wide, `ahead` of them made ahead of the current one."""
    name: str
    retention_days: int
    width_days: int = PARTITION_DAYS
    ahead: int = PARTITIONS_AHEAD


def table(name: str, default_days: int, setting: str | None = None, *, width_days: int = PARTITION_DAYS,
          ahead: int = PARTITIONS_AHEAD, at_least_days: float = 0) -> Table:
    """`name` with its retention from CUTY_<SETTING>_RETENTION_DAYS (`setting` defaults to the name;
    tables that leave together share one), default `default_days`. `at_least_days`: the shortest
    retention the table's readers allow (a key table: its keys' lifetime), refused below it."""
    var = f"CUTY_{(setting or name).upper()}_RETENTION_DAYS"
    days = env_int(var, default_days)
    if days < 0:
        raise ValueError(f"{var} must be >= 0 (0: kept forever)")
    if 0 < days < at_least_days:
        raise ValueError(f"{var} must be 0 (kept forever) or at least {at_least_days:g} days, "
                         f"the lifetime of the rows it keeps")
    return Table(name, days, width_days, ahead)


@dataclass(frozen=True)
class Move:
    """Finished rows of a live table moved into its history by `function(batch, finished_before)`
    once finished more than `after_days` ago; `batch`, when set, caps the job's batch for this mover
    (a mover whose unit brings several rows of other tables along takes fewer units a transaction)."""
    name: str
    function: str
    after_days: float
    batch: int | None = None


def move(name: str, function: str, default_after_days: float, *, at_least_days: float = 0,
         batch: int | None = None) -> Move:
    """`name`'s mover with its age from CUTY_<NAME>_MOVE_AFTER_DAYS (default `default_after_days`).
    `at_least_days`: the shortest age the live table's writers allow (how long a finished row may
    still change), refused below it."""
    var = f"CUTY_{name.upper()}_MOVE_AFTER_DAYS"
    days = env_float(var, default_after_days)
    if days < 0:
        raise ValueError(f"{var} must be >= 0")
    if days < at_least_days:
        raise ValueError(f"{var} must be at least {at_least_days:g} days, how long its finished rows may still change")
    if not function.isidentifier():
        raise ValueError(f"{function!r} is not a function name")
    return Move(name, function, days, batch)


def archive_dir() -> pathlib.Path | None:
    d = env_str("CUTY_RETENTION_ARCHIVE_DIR", "")
    return pathlib.Path(d) if d else None


def interval_seconds() -> float:
    return env_float("CUTY_RETENTION_INTERVAL_SECONDS", 600.0)


def move_batch() -> int:
    return max(1, env_int("CUTY_RETENTION_MOVE_BATCH", MOVE_BATCH))


def move_limit() -> int:
    return max(1, env_int("CUTY_RETENTION_MOVE_LIMIT", MOVE_LIMIT))


@dataclass
class Round:
    created: list[str]
    detached: list[str]
    archived: list[pathlib.Path]
    dropped: list[str]
    moved: dict[str, int]


class Retention:
    def __init__(self, pool, tables: list[Table], archive: pathlib.Path | None = None, moves: list[Move] = (),
                 *, batch: int | None = None, limit: int | None = None):
        self.pool, self.tables, self.archive, self.moves = pool, tables, archive, list(moves)
        self.batch = batch or move_batch()
        self.limit = max(self.batch, limit or move_limit())

    async def move(self, m: Move) -> int:
        """Moves `m`'s finished rows in batches until a batch comes back short or the round's limit."""
        moved, batch = 0, min(self.batch, m.batch or self.batch)
        while moved < self.limit:
            size = min(batch, self.limit - moved)
            n = await self.pool.fetchval(
                f"SELECT {m.function}($1, clock_timestamp() - make_interval(secs => $2))",
                size, m.after_days * 86400.0)
            moved += n
            if n < size:
                break
        return moved

    async def round(self) -> Round:
        with quiet():  # a standing job: no trace per round
            return await self._round()

    async def _round(self) -> Round:
        done = Round([], [], [], [], {})
        # Partitions first, so a row moved into a history always finds its partition.
        for t in self.tables:
            done.created += await self.pool.fetchval(
                "SELECT coalesce(array_agg(p), '{}') FROM cuty_partitions_ahead($1, $2, $3) p",
                t.name, t.width_days, t.ahead)
        for m in self.moves:
            done.moved[m.name] = await self.move(m)
        for t in self.tables:
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
        if done.created or done.dropped or any(done.moved.values()):
            log.info("retention round", extra={"partitions_created": done.created, "dropped": done.dropped, "moved": done.moved,
                                               "archived": [str(p) for p in done.archived]})
        return done

    async def _archive(self, parent: str, name: str) -> pathlib.Path:
        folder = self.archive / parent
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.csv"
        partial = folder / f".{name}.csv.partial"
        # Every merchant's rows (the partition keeps the merchants' policy): set with the transaction's
        # BEGIN, also where the pool's sessions carry no merchant (behind a transaction pooler), which
        # would otherwise archive an empty file and then drop the rows.
        async with UnitOfWork(self.pool, merchant=ALL_MERCHANTS) as uow:
            with open(partial, "wb") as f:
                await uow.conn.copy_from_table(name, output=f, format="csv", header=True)
                f.flush()
                os.fsync(f.fileno())
            await uow.commit()
        os.replace(partial, path)
        return path

    async def run(self, interval: float | None = None) -> None:
        await periodic(self.round, interval or interval_seconds(), what="partition retention", log=log)
