"""Gauges read from the database are exported by one replica at a time (cutylib.metrics.MetricsLeader):
two refreshers on one database, each with its own pool as two replicas would have: one exports,
the other exports nothing; when the leader stops, the other takes over within a refresh."""
from __future__ import annotations

import asyncio

from cutylib.db import create_pool
from cutylib.metrics import Metrics, MetricsLeader, refresh_periodically

INTERVAL = 0.05


class Replica(Metrics):
    def __init__(self, pool):
        super().__init__()
        self.pool = pool
        self.backlog = self.db_gauge("cuty_test_backlog", "A number read from the database")
        self.by_state = self.db_gauge("cuty_test_by_state", "Per state", ["state"])
        self.calls = self.counter("cuty_test_calls_total", "Exported by every replica")

    async def refresh(self) -> None:
        self.backlog.set(await self.pool.fetchval("SELECT 7"))
        self.by_state.labels("PENDING").set(3)
        self.calls.inc()

    def exported(self) -> set[str]:
        return {s.name for f in self.registry.collect() for s in f.samples if s.name.startswith("cuty_test_")}

    def start(self) -> asyncio.Task:
        return asyncio.create_task(refresh_periodically(self.refresh, INTERVAL,
                                                        leader=MetricsLeader(self.pool, "test"), metrics=self))


async def until(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_one_replica_exports_the_database_gauges(scratch_db):
    pools = [await create_pool(scratch_db, min_size=0, max_size=3) for _ in range(2)]
    replicas = [Replica(p) for p in pools]
    tasks = [r.start() for r in replicas]
    try:
        db_gauges = {"cuty_test_backlog", "cuty_test_by_state"}
        await until(lambda: sum(db_gauges <= r.exported() for r in replicas) == 1)
        await asyncio.sleep(INTERVAL * 5)  # several rounds later, still exactly one
        leaders = [i for i, r in enumerate(replicas) if db_gauges <= r.exported()]
        assert len(leaders) == 1
        (leader,) = leaders
        follower = 1 - leader
        assert replicas[follower].exported() & db_gauges == set()
        assert replicas[leader].value("cuty_test_backlog") == 7
        assert "cuty_test_calls_total" in replicas[leader].exported()  # counters: every replica's own

        # The leader stops (its lock goes with its session): the follower takes over.
        tasks[leader].cancel()
        await asyncio.gather(tasks[leader], return_exceptions=True)
        assert replicas[leader].exported() & db_gauges == set()
        await until(lambda: db_gauges <= replicas[follower].exported())
        assert replicas[follower].value("cuty_test_by_state", state="PENDING") == 3
        # ...and gave its connection back to the pool, unlocked.
        async with pools[leader].acquire() as conn:
            assert not await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in pools:
            await p.close()


async def test_a_leader_whose_session_dies_leads_again(scratch_db):
    """The leader's session is killed (failover, a network cut): the next round notices and elects again."""
    pool = await create_pool(scratch_db, min_size=0, max_size=3)
    replica = Replica(pool)
    task = replica.start()
    try:
        await until(lambda: "cuty_test_backlog" in replica.exported())
        async with pool.acquire() as conn:
            for _ in range(2000):  # elected: its session holds the lock (exported() may precede it)
                if await conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                                       " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"):
                    break
                await asyncio.sleep(0.01)
            killed = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
        assert killed == 1
        # The next round finds the session gone and elects again (the lock is free): exporting again.
        await asyncio.sleep(INTERVAL * 4)
        await until(lambda: "cuty_test_backlog" in replica.exported())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()
