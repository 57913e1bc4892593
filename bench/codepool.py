"""Code pool benchmark (`make bench-codepool`, "Benchmark").

On one product with 1,000,000 available codes, in one run:
  * import of the 1,000,000 codes through the ImportCodes stream: codes/s and the service's peak RSS;
  * ReserveCodes (quantity 1) over gRPC at 1, 8 and 32 in flight, against the raw SKIP LOCKED
    statement through asyncpg (the limit) and the naive FOR UPDATE without SKIP LOCKED;
  * 60 s sustained at 32 in flight, in windows, to show SKIP LOCKED does not degrade as dead index
    entries pile up; EXPLAIN (ANALYZE, BUFFERS) of the reserve query before and after.
The service runs as its own process (`python -m codepool`), as in production.

    python bench/codepool.py [--quick] [--codes N]      (BENCH_QUICK=1 also means --quick)
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import os
import secrets
import time
import uuid

from _common import ROOT, Run, bench_postgres, closed_loop, report

import asyncpg

from cuty.codepool.v1 import codepool_pb2 as pb, codepool_pb2_grpc
from cuty.common.v1 import common_pb2
from cutylib.config import with_database
from cutylib.db import migrate
from codepool.grpc_api import CALLERS
from cutylib.testing.trust import acting_channel, user
from cutylib.testing.procs import ServiceProcess, base_env, free_port

MIGRATIONS = ROOT / "services" / "codepool" / "migrations"
# codes_available leads with the merchant; the service's RESERVE names it too.
PICK = """SELECT id FROM codes WHERE merchant_id = $2 AND product_id = $1 AND status = 'available'
ORDER BY seq LIMIT 1 FOR UPDATE{skip}"""
RAW = """WITH picked AS ({pick})
UPDATE codes c SET status = 'reserved' FROM picked WHERE c.id = picked.id RETURNING c.id"""
RAW_SKIP = RAW.format(pick=PICK.format(skip=" SKIP LOCKED"))
RAW_NAIVE = RAW.format(pick=PICK.format(skip=""))
RAW_CAP = 40_000


def peak_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def explain(conn: asyncpg.Connection, product_id: uuid.UUID, merchant_id: str, title: str) -> str:
    tx = conn.transaction()
    await tx.start()
    try:
        rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + PICK.format(skip=" SKIP LOCKED"),
                                product_id, merchant_id)
    finally:
        await tx.rollback()
    plan = "\n".join("    " + r[0] for r in rows)
    stats = await conn.fetchrow("SELECT n_live_tup, n_dead_tup, autovacuum_count, last_autovacuum "
                                "FROM pg_stat_user_tables WHERE relname = 'codes'")
    print(f"\n-- EXPLAIN of the reserve query ({title}); codes: {dict(stats)}\n{plan}")
    return plan


async def import_codes(stub, product_id: str, n: int, pid: int) -> tuple[Run, float]:
    run_tag = secrets.token_hex(4)
    per_message = 5000

    def messages():
        for start in range(0, n, per_message):
            codes = [f"BENCH-{run_tag}-{i:09d}-{secrets.token_hex(4)}" for i in range(start, min(n, start + per_message))]
            yield pb.ImportCodesChunk(product_id=product_id if start == 0 else "",
                                      batch_ref="bench-" + run_tag if start == 0 else "", codes=codes)

    t0 = time.perf_counter()
    resp = await stub.ImportCodes(messages(), timeout=3600)
    seconds = time.perf_counter() - t0
    assert resp.accepted and resp.imported == n, resp
    return Run(ops=n, seconds=seconds, latencies_ms=[seconds * 1000]), peak_rss_mb(pid)


async def main(quick: bool, n_codes: int) -> None:
    window = 3.0 if quick else 10.0
    step = 3.0 if quick else 10.0
    sustained = 15.0 if quick else 60.0
    pg = bench_postgres()
    proc = None
    results = []
    try:
        dsn = with_database(pg.dsn, "cuty_codepool")
        await migrate(dsn, MIGRATIONS)
        tuned = ""
        if pg.cluster is not None:
            # Our own throwaway server: wake autovacuum often enough for the per-table thresholds of
            # the migration to matter (a server setting: in production, a CloudNativePG parameter).
            admin = await asyncpg.connect(pg.dsn)
            await admin.execute("ALTER SYSTEM SET autovacuum_naptime = '5s'")
            await admin.execute("SELECT pg_reload_conf()")
            await admin.close()
            tuned = "autovacuum_naptime=5s; "
        if pg.cluster is not None and pg.cluster.fast_unsafe:
            tuned += "fsync=off (throwaway cluster); "
        keys = f"b1:{base64.b64encode(os.urandom(32)).decode()};hash={base64.b64encode(os.urandom(32)).decode()}"
        port = free_port()
        env = base_env(CUTY_CODEPOOL_DATABASE_URL=dsn, CUTY_CODEPOOL_GRPC_PORT=port, CUTY_CODE_KEYS=keys,
                       CUTY_LOG_LEVEL="WARNING", CUTY_DB_POOL_MAX=32, CUTY_DB_POOL_MIN=8)
        proc = ServiceProcess("codepool", env, ROOT / "build" / "bench-codepool.log", grpc_port=port).start()
        await proc.wait_healthy(60)
        pid = proc.proc.pid
        base_rss = rss_mb(pid)
        # Each RPC with a certificate its caller table allows (import: the service's own CLI identity).
        async with acting_channel(f"127.0.0.1:{port}", "codepool", CALLERS, deadline_seconds=30) as channel:
            stub = codepool_pb2_grpc.CodePoolServiceStub(channel)
            product = await stub.CreateProduct(pb.CreateProductRequest(
                sku="bench-" + secrets.token_hex(4), name="bench", price=common_pb2.Money(currency_code="TRY", amount_minor=100)),
                metadata=user("bench-admin", "admin"))
            product_uuid = uuid.UUID(product.id)

            run, peak = await import_codes(stub, product.id, n_codes, pid)
            results.append(run.result("import 1M codes (ImportCodes stream)" if n_codes == 1_000_000 else
                                      f"import {n_codes} codes (ImportCodes stream)", 1,
                                      notes=f"codes/s; service peak RSS {peak:.0f} MB (idle {base_rss:.0f} MB)",
                                      peak_rss_mb=round(peak, 1), seconds=round(run.seconds, 1)))
            print(f"imported {n_codes} codes in {run.seconds:.1f}s = {run.ops_per_s:,.0f} codes/s; "
                  f"service peak RSS {peak:.0f} MB")

            conn = await asyncpg.connect(dsn)
            await conn.execute("VACUUM ANALYZE codes")
            await explain(conn, product_uuid, product.merchant_id, "fresh table")

            async def grpc_reserve(i: int) -> None:
                order = f"bench-{i}-{secrets.token_hex(6)}"
                await stub.ReserveCodes(pb.ReserveCodesRequest(order_id=order, order_item_id=order + "/1",
                                                               product_id=product.id, quantity=1,
                                                               # one customer per order: a customer may hold
                                                               # only CUTY_MAX_ACTIVE_RESERVATIONS
                                                               customer_id=order))

            for c in (1, 8, 32):
                pool = await asyncpg.create_pool(dsn, min_size=c, max_size=c)
                # The raw statements run far faster than the service; capped so the million codes last.
                raw = await closed_loop(lambda i: pool.fetchval(RAW_SKIP, product_uuid, product.merchant_id),
                                        concurrency=c, duration=step,
                                        total=RAW_CAP)
                rpc = await closed_loop(grpc_reserve, concurrency=c, duration=step)
                naive = await closed_loop(lambda i: pool.fetchval(RAW_NAIVE, product_uuid, product.merchant_id),
                                          concurrency=c, duration=step,
                                          total=RAW_CAP)
                await pool.close()
                results.append(raw.result("raw SKIP LOCKED statement (asyncpg, the limit)", c))
                results.append(rpc.result("ReserveCodes qty 1 (gRPC)", c, limit=raw,
                                          notes="max/p50 = %.1f" % (max(rpc.latencies_ms) / _p50(rpc))))
                results.append(naive.result("naive FOR UPDATE, no SKIP LOCKED (asyncpg)", c, limit=raw))

            windows = []
            t_end = time.monotonic() + sustained
            all_lat: list[float] = []
            ops = 0
            errors = 0
            t0 = time.perf_counter()
            while time.monotonic() < t_end:
                w = await closed_loop(grpc_reserve, concurrency=32, duration=min(window, max(0.5, t_end - time.monotonic())))
                windows.append(f"{w.ops_per_s:.0f}/s p50 {_p50(w):.1f}ms max {max(w.latencies_ms):.0f}ms")
                all_lat += w.latencies_ms
                ops += w.ops
                errors += w.errors
            total = Run(ops=ops, seconds=time.perf_counter() - t0, latencies_ms=all_lat, errors=errors)
            print("sustained windows: " + " | ".join(windows))
            results.append(total.result(f"ReserveCodes qty 1 (gRPC) sustained {sustained:.0f}s", 32,
                                        limit=raw,
                                        notes=tuned + "max/p50 = %.1f" % (max(all_lat) / _p50(total)),
                                        windows=windows))
            await explain(conn, product_uuid, product.merchant_id, "after the sustained run")
            left = await conn.fetchval("SELECT count(*) FROM codes WHERE product_id = $1 AND status = 'available'",
                                       product_uuid)
            print(f"available codes left: {left}")
            await conn.close()
    finally:
        if proc is not None:
            proc.stop()
        pg.close()
    report("codepool", results)


def _p50(run: Run) -> float:
    lat = sorted(run.latencies_ms)
    return lat[len(lat) // 2] if lat else 0.0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", default=os.environ.get("BENCH_QUICK") == "1",
                    help="short steps (3 s) and a 15 s sustained run instead of 10 s / 60 s")
    ap.add_argument("--codes", type=int, default=1_000_000)
    args = ap.parse_args()
    asyncio.run(main(args.quick, args.codes))
