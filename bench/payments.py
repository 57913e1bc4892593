"""Payments benchmark (`make bench-payments`): the one finalize path under concurrent writers.

  (a) many payments: 32 writers, each payment finalized by a sync answer (`processing`) and a webhook
      (`succeeded`) racing, through PaymentsCore.finalize; beside it the raw version-token UPDATE
      through asyncpg on other payments (the database's limit for the same conditional write)
  (b) the webhook path on many payments: lease + finalize + release (what a webhook costs)
  (c) one hot payment: 32 writers on the same payment (sync and webhook observations of
      requires_action / processing / succeeded, stale ones included), a fresh hot payment every 32
      finalizes; beside it the raw version-token UPDATE, 32 writers on one row
Every run checks for lost updates: version == 1 + accepted changes, one `succeeded` per payment.

Finalize runs in process (the saga calls it so); figures on a shared 2-core machine are noisy.
BENCH_SECONDS (default 5) sets each measured run's length.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import random
import uuid

from _common import Result, bench_postgres, closed_loop, report

from cutylib.config import Settings, with_database
from cutylib.db import create_pool, migrate
from payments import metrics as m
from payments.service import PaymentsCore
from payments.settings import PaymentsOptions

SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
WRITERS = 32
MIGRATIONS = pathlib.Path(__file__).resolve().parents[1] / "services" / "payments" / "migrations"

SEED = """
INSERT INTO payments (id, customer_id, amount_minor, currency, payment_method, idempotency_key, reconcile_at)
SELECT id, 'bench', 1000, 'TRY', 'pm_card_ok', id::text, clock_timestamp() + interval '1 day'
FROM unnest($1::uuid[]) AS id
"""
RAW_UPDATE = """
UPDATE payments SET version = version + 1, updated_at = clock_timestamp()
WHERE id = $1 AND version = $2 RETURNING version
"""
VERSION = "SELECT version FROM payments WHERE id = $1"


class NoPsp:
    """Finalize never calls the PSP for consistent observations; a call here would be a bug."""

    def __getattr__(self, name):
        raise AssertionError(f"the benchmark must not reach the PSP ({name})")


async def seed(pool, n: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    for i in range(0, n, 10_000):
        await pool.execute(SEED, ids[i:i + 10_000])
    return ids


async def raw_version_token(pool, ids: list[uuid.UUID], pick) -> tuple:
    """The bare version-token write: read the version, UPDATE ... WHERE version = $2, retry on zero rows."""
    conflicts = 0
    applied = 0

    async def op(i: int) -> None:
        nonlocal conflicts, applied
        pid = pick(ids, i)
        async with pool.acquire() as conn:
            while True:
                v = await conn.fetchval(VERSION, pid)
                if await conn.fetchval(RAW_UPDATE, pid, v) is not None:
                    applied += 1
                    return
                conflicts += 1
    run = await closed_loop(op, concurrency=WRITERS, duration=SECONDS)
    return run, conflicts, applied


async def check_no_lost_update(pool, ids: list[uuid.UUID]) -> str:
    bad = await pool.fetchval("""
        SELECT count(*) FROM payments p
        WHERE p.id = ANY($1) AND p.version <> 1 + (SELECT count(*) FROM payment_events e WHERE e.payment_id = p.id)
           OR p.id = ANY($1) AND (SELECT count(*) FROM payment_events e
                                  WHERE e.payment_id = p.id AND e.to_status = 'succeeded') > 1""", ids)
    return "no lost update" if bad == 0 else f"LOST UPDATES on {bad} payments"


async def main() -> None:
    pg = bench_postgres()
    dsn = with_database(pg.dsn, "cuty_payments_bench")
    await migrate(dsn, MIGRATIONS)
    pool = await create_pool(dsn, min_size=WRITERS + 4, max_size=WRITERS + 8)
    settings = dataclasses.replace(Settings(), lease_seconds=30.0)
    core = PaymentsCore(settings, pool, NoPsp(), options=PaymentsOptions(), metrics=m.PaymentsMetrics(), worker_id="bench")
    results: list[Result] = []
    try:
        estimate = int(SECONDS * 4000) + 1000  # more payments than a fast run can use

        # (a) many payments -------------------------------------------------------------------------
        raw_ids = await seed(pool, estimate)
        raw, raw_conflicts, _ = await raw_version_token(pool, raw_ids, lambda ids, i: ids[(i // 2) % len(ids)])
        ids = await seed(pool, estimate)
        core.metrics = m.PaymentsMetrics()

        async def sync_and_webhook(i: int) -> None:
            pid = ids[(i // 2) % len(ids)]  # two consecutive ops (different writers) race on one payment
            if i % 2 == 0:
                await core.finalize(pid, "processing", "sync")
            else:
                await core.finalize(pid, "succeeded", "webhook")
        run = await closed_loop(sync_and_webhook, concurrency=WRITERS, duration=SECONDS)
        used = ids[:min(len(ids), run.ops // 2 + WRITERS)]
        results.append(run.result("finalize, many payments (sync+webhook)", WRITERS, limit=raw,
                                  notes=await check_no_lost_update(pool, used),
                                  version_conflicts=core.metrics.value(m.VERSION_CONFLICTS),
                                  raw_version_conflicts=raw_conflicts))

        # (b) webhook path with the lease ---------------------------------------------------------------
        ids = await seed(pool, estimate)
        core.metrics = m.PaymentsMetrics()

        async def webhook_leased(i: int) -> None:
            pid = ids[i % len(ids)]
            while await core.finalize_leased(pid, "succeeded", "webhook") is None:
                await asyncio.sleep(0.001)
        run = await closed_loop(webhook_leased, concurrency=WRITERS, duration=SECONDS)
        results.append(run.result("webhook path (lease+finalize+release)", WRITERS, limit=raw,
                                  notes=await check_no_lost_update(pool, ids[:run.ops + WRITERS]),
                                  deferred=core.metrics.value(m.DEFERRED_FINALIZES)))

        # (c) one hot payment ---------------------------------------------------------------------------
        hot_raw = await seed(pool, 1)
        raw_hot, raw_hot_conflicts, applied = await raw_version_token(pool, hot_raw, lambda ids, i: ids[0])
        final_version = await pool.fetchval(VERSION, hot_raw[0])
        raw_note = "no lost update" if final_version == 1 + applied else f"LOST {1 + applied - final_version}"

        hot = await seed(pool, int(SECONDS * 2000) + 100)
        core.metrics = m.PaymentsMetrics()
        rng = random.Random(4)
        observed = ["requires_action", "processing", "succeeded"]

        async def hot_payment(i: int) -> None:
            pid = hot[(i // WRITERS) % len(hot)]
            status = "succeeded" if i % WRITERS == WRITERS - 1 else rng.choice(observed)
            await core.finalize(pid, status, "sync" if i % 2 else "webhook")
        run = await closed_loop(hot_payment, concurrency=WRITERS, duration=SECONDS)
        used = hot[:run.ops // WRITERS + 2]
        results.append(run.result("finalize, one hot payment", WRITERS, limit=raw_hot,
                                  notes=f"{await check_no_lost_update(pool, used)}; raw: {raw_note}",
                                  version_conflicts=core.metrics.value(m.VERSION_CONFLICTS),
                                  raw_version_conflicts=raw_hot_conflicts, hot_payments=len(used)))
    finally:
        await pool.close()
        pg.close()
    report("payments", results)


if __name__ == "__main__":
    asyncio.run(main())
