"""A flash sale on one product (`make bench-rush`): BENCH_RUSH_CODES (20,000) codes, every one of
them reserved (ReserveCodes' use case, ReservationService.reserve, quantity 1) by BENCH_RUSH_BUYERS
(16) buyers at once until the product sells out, nothing released. Each reservation's latency is
kept in the order they finished; the figures compare the first thousand with the last thousand.

Claiming walks `codes_available` (merchant, product, seq) WHERE status = 'available' from the
oldest code with FOR UPDATE SKIP LOCKED. A code that is reserved leaves the index only when vacuum
removes its entry, so without care the head of the index fills with dead entries and every later
claim steps over all the codes sold so far in this rush (docs/codepool.md, "A rush on one product").

Also printed: the index's dead entries (pgstattuple is not needed: the buffers a claim reads, from
EXPLAIN (ANALYZE, BUFFERS) of the pick at the end of the rush).
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import statistics
import time
import uuid

import asyncpg

from _common import ROOT, Run, bench_postgres, closed_loop, percentile, report

from cutylib.config import with_database
from cutylib.db import create_pool, migrate
from codepool.domain import ReserveCommand
from codepool.service import ReservationService

CODES = int(os.environ.get("BENCH_RUSH_CODES", "20000"))
BUYERS = int(os.environ.get("BENCH_RUSH_BUYERS", "16"))
SLICE = 1000
MERCHANT = "m-rush"

FILL = """
INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash)
SELECT gen_random_uuid(), $1, $2, $3, 'k', substr(sha256(g::text::bytea), 1, 12), sha256(g::text::bytea),
       sha256(($4 || g)::bytea)
FROM generate_series(1, $5::bigint) g
"""
PICK = ("SELECT id FROM codes WHERE merchant_id = $1 AND product_id = $2 AND status = 'available' "
        "ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED")


async def product(conn: asyncpg.Connection, codes: int) -> uuid.UUID:
    pid, batch = uuid.uuid4(), uuid.uuid4()
    await conn.execute("INSERT INTO products (id, merchant_id, sku, name, price_minor, currency) "
                       "VALUES ($1, $2, $3, 'Rush', 500, 'TRY')", pid, MERCHANT, pid.hex[:8])
    await conn.execute("INSERT INTO supplier_batches (id, merchant_id, product_id, batch_ref, received, imported, "
                       "content_digest, actor) VALUES ($1, $2, $3, 'rush', $4, $4, $5, 'bench')",
                       batch, MERCHANT, pid, codes, os.urandom(32))
    await conn.execute(FILL, MERCHANT, pid, batch, pid.hex, codes)
    return pid


async def rush(pool, conn, codes: int) -> tuple[list[float], str]:
    pid = await product(conn, codes)
    await conn.execute("VACUUM ANALYZE codes")
    service = ReservationService(pool, ttl_seconds=3600, max_active=10, max_quantity=10)
    done: list[float] = []  # latency of each reservation, in the order they finished

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        order = f"rush-{pid.hex[:8]}-{i}"
        await service.reserve(ReserveCommand(order, order + "/1", pid, 1, f"buyer-{i}"), "bench")
        done.append((time.perf_counter() - t0) * 1000)

    await closed_loop(one, concurrency=BUYERS, total=codes)
    rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {PICK}", MERCHANT, pid)
    return done, "\n".join(r[0] for r in rows)


def slice_run(lat: list[float]) -> Run:
    return Run(ops=len(lat), seconds=sum(lat) / 1000 / BUYERS, latencies_ms=lat)


async def main() -> None:
    server = bench_postgres()
    dsn = with_database(server.dsn, f"cuty_rush_{uuid.uuid4().hex[:8]}")
    await migrate(dsn, pathlib.Path(ROOT / "services" / "codepool" / "migrations"))
    conn = await asyncpg.connect(dsn)
    pool = await create_pool(dsn, min_size=BUYERS, max_size=BUYERS + 2)
    try:
        # A warm-up rush on another product, so the first thousand do not pay for cold caches.
        await rush(pool, conn, 2 * SLICE)
        lat, plan = await rush(pool, conn, CODES)
    finally:
        await pool.close()
        await conn.close()
        server.close()
    first, last = lat[:SLICE], lat[-SLICE:]
    results = [slice_run(first).result(f"reserve, first {SLICE:,} of {CODES:,}", BUYERS),
               slice_run(last).result(f"reserve, last {SLICE:,} of {CODES:,}", BUYERS, limit=slice_run(first),
                                      notes="ratio: last thousand's rate over the first's")]
    ratio = {"p50": round(percentile(sorted(last), 0.5) / percentile(sorted(first), 0.5), 2),
             "mean": round(statistics.mean(last) / statistics.mean(first), 2),
             "p99": round(percentile(sorted(last), 0.99) / percentile(sorted(first), 0.99), 2)}
    per_thousand = [round(statistics.median(lat[i:i + SLICE]), 2) for i in range(0, len(lat), SLICE)]
    results[0].extra.update({"last_over_first_latency": ratio, "p50_ms_per_thousand": per_thousand,
                             "load_average": os.getloadavg()})
    report("rush", results)
    print("\nthe pick after the rush (sold out):\n" + plan)


if __name__ == "__main__":
    asyncio.run(main())
