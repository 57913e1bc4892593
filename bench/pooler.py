"""Pooler benchmark (`make bench-pooler`): asyncpg through PgBouncer in transaction mode, as the
prod overlay's CNPG Poolers put it in front of booking's and codepool's databases (docs/deploy.md).

HoldSlot's statement (`booking_take_hold`, one round trip) at 64 in flight over 16 client
connections, three ways, alternated in rounds:
  direct           asyncpg to PostgreSQL, prepared statements cached (as today)
  direct, no cache asyncpg to PostgreSQL with statement_cache_size=0 (what a pre-1.21 pooler needs)
  pgbouncer        asyncpg through PgBouncer (pool_mode=transaction) with statement_cache_size=0
and whether asyncpg's cached prepared statements survive PgBouncer: they need PgBouncer >= 1.21
with max_prepared_statements (the CNPG Pooler's image is newer; Debian 12 ships 1.18).

Needs the `pgbouncer` binary (Debian package pgbouncer); prints how to get it otherwise.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from _common import bench_postgres, closed_loop, in_turns, merged, report  # puts services and generated code on sys.path

import asyncpg

from cutylib.config import with_database
from cutylib.db import migrate
from cutylib.pgcluster import free_port

N = int(float(os.environ.get("BENCH_SCALE", "1")) * 12000)
IN_FLIGHT, CONNECTIONS, ROUNDS = 64, 16, 4
ROOT = pathlib.Path(__file__).resolve().parents[1]
TAKE = "SELECT outcome FROM booking_take_hold($1, $2, $3, $4, 300, 1000000, 3)"


async def seed(dsn: str, n: int) -> list[uuid.UUID]:
    conn = await asyncpg.connect(dsn)
    try:
        salon, resource = uuid.uuid4(), uuid.uuid4()
        # booking's tables belong to a merchant: the children name their salon's
        await conn.execute("INSERT INTO salons (id, merchant_id, name, time_zone) VALUES ($1, 'bench', 'bench', 'UTC')",
                           salon)
        await conn.execute("INSERT INTO resources (id, merchant_id, salon_id, name) VALUES ($1, 'bench', $2, 'chair')",
                           resource, salon)
        rows = await conn.fetch(
            "INSERT INTO slots (id, merchant_id, salon_id, resource_id, start_time, end_time, price_minor, currency) "
            "SELECT gen_random_uuid(), 'bench', $1, $2, t, t + interval '30 minutes', 100, 'TRY' "
            "FROM generate_series(date_trunc('hour', now()) + interval '1 day', "
            "                     date_trunc('hour', now()) + interval '1 day' + ($3 - 1) * interval '30 minutes', "
            "                     interval '30 minutes') t RETURNING id", salon, resource, n)
        return [r["id"] for r in rows]
    finally:
        await conn.close()


def start_pgbouncer(work: pathlib.Path, pg_port: int, dbname: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    (work / "users.txt").write_text('"postgres" ""\n')
    (work / "pgbouncer.ini").write_text(f"""[databases]
bench = host=127.0.0.1 port={pg_port} dbname={dbname} user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {work / 'users.txt'}
pool_mode = transaction
default_pool_size = {CONNECTIONS}
max_client_conn = 1000
logfile = {work / 'pgbouncer.log'}
""")
    cmd = [shutil.which("pgbouncer"), str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root: run it as postgres, which owns its folder
        import pwd

        pw = pwd.getpwnam("postgres")
        for f in (work, *work.iterdir()):
            os.chown(f, pw.pw_uid, pw.pw_gid)
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            import socket
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"pgbouncer did not start; see {work / 'pgbouncer.log'}")


def taker(pool: asyncpg.Pool, slots: list[uuid.UUID], tag: str):
    async def op(i: int) -> None:
        r = await pool.fetchval(TAKE, uuid.uuid4(), slots[i], f"{tag}-{i}", f"{tag}-{i}")
        assert r == "held", r
    return op


async def main() -> None:
    if shutil.which("pgbouncer") is None:
        print("pgbouncer not installed: apt-get install pgbouncer (Debian), then make bench-pooler")
        return
    pg = bench_postgres()
    work = pathlib.Path(tempfile.mkdtemp(prefix="cuty-bench-pooler-"))
    dbname = f"cuty_booking_pooler_{uuid.uuid4().hex[:6]}"
    dsn = with_database(pg.dsn, dbname)
    bouncer = None
    try:
        await migrate(dsn, ROOT / "services" / "booking" / "migrations")
        pg_port = int(dsn.rsplit(":", 1)[1].split("/")[0])
        bouncer, port = start_pgbouncer(work, pg_port, dbname)
        via = f"postgresql://postgres@127.0.0.1:{port}/bench"
        slots = await seed(dsn, 3 * N + 3 * 500)
        kw = dict(min_size=CONNECTIONS, max_size=CONNECTIONS)
        pools = {"direct (statement cache)": await asyncpg.create_pool(dsn, **kw),
                 "direct, statement_cache_size=0": await asyncpg.create_pool(dsn, statement_cache_size=0, **kw),
                 "pgbouncer transaction mode, statement_cache_size=0":
                     await asyncpg.create_pool(via, statement_cache_size=0, **kw)}
        # Prepared statements as asyncpg caches them, through this PgBouncer: do they survive?
        cached = await asyncpg.create_pool(via, **kw)
        try:
            await asyncio.gather(*(cached.fetchval("SELECT $1::int + 1", i) for i in range(200)))
            prepared = "work"
        except Exception as e:  # noqa: BLE001 - the finding
            prepared = f"fail ({type(e).__name__}: {' '.join(str(e).split())[:90]})"
        await cached.close()
        version = subprocess.run([shutil.which("pgbouncer"), "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        print(f"{version}: asyncpg's cached prepared statements through it {prepared}")
        names, chunk = list(pools), N // ROUNDS
        for k, n in enumerate(names):  # warm up
            await closed_loop(taker(pools[n], slots[k * 500:(k + 1) * 500], f"w{k}"), concurrency=IN_FLIGHT, total=500)
        rest = slots[1500:]

        def turns(k: int, n: str):
            def round_of(r: int):
                part = rest[(k * ROUNDS + r) * chunk:(k * ROUNDS + r + 1) * chunk]
                return taker(pools[n], part, f"{k}-{r}"), chunk
            return round_of
        runs, _ = await in_turns({n: turns(k, n) for k, n in enumerate(names)}, rounds=ROUNDS, concurrency=IN_FLIGHT)
        direct = merged(runs[names[0]])
        results = [direct.result(f"booking_take_hold, {names[0]}", IN_FLIGHT, notes=f"{CONNECTIONS} connections")]
        for n in names[1:]:
            results.append(merged(runs[n]).result(f"booking_take_hold, {n}", IN_FLIGHT, limit=direct,
                                                  notes=f"prepared statements through {version}: {prepared}"))
        for p in pools.values():
            await p.close()
        report("pooler", results)
    finally:
        if bouncer is not None:
            bouncer.terminate()
        pg.close()


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    asyncio.run(main())
