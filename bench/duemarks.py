"""A merchant's due mark as the outbox's writers take it (`make bench-duemarks`).

Every delivery written for a subscribed merchant marks its merchant due in the same statement
(webhook_merchant_due, docs/webhooks-out.md "What a claim costs"). Its common case is a mark that is
already due: a FOR SHARE probe, run in a block of its own so that a probe that finds the mark moved
later meanwhile leaves no lock behind (the block is a subtransaction). This measures that case
against the raw FOR SHARE statement it wraps, both in a transaction of their own as a writer's is,
BENCH_IN_FLIGHT writers (default 8) of one merchant at once (they share the lock), the two
alternated in BENCH_ROUNDS rounds of BENCH_SECONDS: calls a second, p50 / p99, and the function's
rate against the raw statement's in the same run.
"""
from __future__ import annotations

import asyncio
import os
import uuid

import asyncpg

from _common import ROOT, Run, bench_postgres, closed_loop, merged, report

from cutylib.config import with_database
from cutylib.db import migrate

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "6"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "2"))
IN_FLIGHT = int(os.environ.get("BENCH_IN_FLIGHT", "8"))
MERCHANT = "bench-duemarks"

RAW = ("SELECT 1 FROM webhook_merchants_due WHERE merchant_id = $1 AND due_at <= clock_timestamp() "
       "FOR SHARE")
FUNCTION = "SELECT webhook_merchant_due($1, clock_timestamp())"
VARIANTS = {"the raw FOR SHARE probe": RAW, "webhook_merchant_due, the mark due": FUNCTION}


async def main() -> None:
    server = bench_postgres()
    try:
        dsn = with_database(server.dsn, f"cuty_payments_duemarks_{uuid.uuid4().hex[:6]}")
        await migrate(dsn, ROOT / "services" / "payments" / "migrations")
        pool = await asyncpg.create_pool(dsn, min_size=IN_FLIGHT, max_size=IN_FLIGHT)
        await pool.execute("INSERT INTO webhook_merchants_due (merchant_id, due_at) "
                           "VALUES ($1, clock_timestamp() - interval '1 hour')", MERCHANT)

        def writer(sql: str):
            async def op(i: int) -> None:
                async with pool.acquire() as con, con.transaction():
                    await con.execute(sql, MERCHANT)
            return op

        for sql in VARIANTS.values():  # plans cached on every connection, not measured
            await closed_loop(writer(sql), concurrency=IN_FLIGHT, total=20 * IN_FLIGHT)
        runs: dict[str, list[Run]] = {name: [] for name in VARIANTS}
        for rnd in range(ROUNDS):
            order = list(VARIANTS.items()) if rnd % 2 == 0 else list(reversed(VARIANTS.items()))
            for name, sql in order:
                runs[name].append(await closed_loop(writer(sql), concurrency=IN_FLIGHT, duration=SECONDS))
        await pool.close()
    finally:
        server.close()
    raw = merged(runs["the raw FOR SHARE probe"])
    results = [merged(r).result(f"a writer's transaction: {name}", IN_FLIGHT, limit=raw,
                                notes=f"{ROUNDS} rounds, one merchant") for name, r in runs.items()]
    results[0].extra.update({"load_average": os.getloadavg()})
    report("duemarks", results)


if __name__ == "__main__":
    asyncio.run(main())
