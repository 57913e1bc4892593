"""Gauges read from the database are exported by one replica at a time (cutylib.metrics.MetricsLeader):
two refreshers on one database, each with its own pool as two replicas would have: one exports,
the other exports nothing; when the leader stops, the other takes over within a refresh."""
from __future__ import annotations

import asyncio
import pathlib

import asyncpg

from cutylib.db import create_pool
from cutylib.metrics import LeaseLeader, Metrics, MetricsLeader, refresh_periodically

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


# --- the lease row (LeaseLeader): what codepool uses behind PgBouncer in transaction mode ----------

LEASES = pathlib.Path(__file__).resolve().parents[3] / "services" / "codepool" / "migrations" / "0040_metrics_leases.sql"


class LeaseReplica(Replica):
    def __init__(self, pool, ttl: float = 30.0):
        super().__init__(pool)
        self.leader = LeaseLeader(pool, "test", ttl=ttl)
        self.elections = 0  # rounds whose election finished
        elect = self.leader.elect

        async def counted() -> bool:
            try:
                return await elect()
            finally:
                self.elections += 1
        self.leader.elect = counted

    def start(self) -> asyncio.Task:
        return asyncio.create_task(refresh_periodically(self.refresh, INTERVAL, leader=self.leader, metrics=self))


async def leases_db(scratch_db) -> list:
    conn = await asyncpg.connect(scratch_db)
    await conn.execute(LEASES.read_text())
    await conn.close()
    return [await create_pool(scratch_db, min_size=0, max_size=3) for _ in range(2)]


DB_GAUGES = {"cuty_test_backlog", "cuty_test_by_state"}


async def test_one_replica_exports_by_lease_and_the_other_takes_over_when_it_stops(scratch_db):
    pools = await leases_db(scratch_db)
    replicas = [LeaseReplica(p) for p in pools]
    tasks = [r.start() for r in replicas]
    try:
        await until(lambda: sum(DB_GAUGES <= r.exported() for r in replicas) == 1)
        await asyncio.sleep(INTERVAL * 5)  # several renewals later, still exactly one
        (leader,) = [i for i, r in enumerate(replicas) if DB_GAUGES <= r.exported()]
        follower = 1 - leader
        assert replicas[follower].exported() & DB_GAUGES == set()
        # A clean stop gives the lease up: the follower takes over without waiting for the expiry
        # (30 s here, far longer than `until` allows the takeover).
        tasks[leader].cancel()
        await asyncio.gather(tasks[leader], return_exceptions=True)
        assert replicas[leader].exported() & DB_GAUGES == set()
        await until(lambda: DB_GAUGES <= replicas[follower].exported(), timeout=15)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in pools:
            await p.close()


async def test_the_lease_does_not_live_in_a_session(scratch_db):
    """What a transaction pooler does to sessions: every connection of the leader is cut between
    rounds. The leader keeps the lease (it is a row, not a session lock) and the other replica never
    leads while it is renewed."""
    pools = await leases_db(scratch_db)
    replicas = [LeaseReplica(p) for p in pools]
    tasks = [r.start() for r in replicas]
    try:
        await until(lambda: sum(DB_GAUGES <= r.exported() for r in replicas) == 1)
        (leader,) = [i for i, r in enumerate(replicas) if DB_GAUGES <= r.exported()]
        conn = await asyncpg.connect(scratch_db)
        try:
            for _ in range(5):
                await conn.fetchval("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                    " WHERE datname = current_database() AND pid <> pg_backend_pid()")
                await asyncio.sleep(INTERVAL * 3)
                assert replicas[1 - leader].exported() & DB_GAUGES == set()
            holders = await conn.fetch("SELECT holder FROM metrics_leases WHERE name = 'test'")
        finally:
            await conn.close()
        assert [r["holder"] for r in holders] == [replicas[leader].leader.holder]
        await until(lambda: DB_GAUGES <= replicas[leader].exported())  # renewed through new connections
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in pools:
            await p.close()


async def test_a_dead_leaders_lease_is_taken_over_once_it_expires(scratch_db):
    """A replica that died without resigning holds the lease until it expires: nobody exports (an
    absent alert, never a double count) until then, and the next replica leads after."""
    pools = await leases_db(scratch_db)
    conn = await asyncpg.connect(scratch_db)
    await conn.execute("INSERT INTO metrics_leases VALUES ('test', 'dead-replica', now() + interval '1 hour')")
    replica = LeaseReplica(pools[0])
    task = replica.start()
    try:
        await until(lambda: replica.elections >= 3)  # three rounds ran, each refused
        assert replica.exported() & DB_GAUGES == set()
        await conn.execute("UPDATE metrics_leases SET expires_at = now() - interval '1 second'")  # time passes
        await until(lambda: DB_GAUGES <= replica.exported())
        assert await conn.fetchval("SELECT holder FROM metrics_leases") == replica.leader.holder
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await conn.close()
        for p in pools:
            await p.close()
