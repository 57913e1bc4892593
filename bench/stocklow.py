"""What deciding `stock.low` costs a hot product (`make bench-stocklow`).

32 reservations in flight on one product (the code pool's reserve statement, raw asyncpg), the
decision function (codepool_stock_changed) swapped in turn, back to back, BENCH_ROUNDS times:

- `lock always`: every statement that changes the stock takes the product's lock until commit (the
  design the fast path replaced, kept here as the comparison);
- `fast path`: the function as migrated (migrations/functions/codepool_stock_changed.sql): the lock
  only near a decision (flag set, or at or below the threshold as the statement sees it), the
  recheck covering what a race on the fast path leaves;
- `no decision`: the trigger still fires, decides nothing: the limit the ratio is taken against.

The stock counters (product_stock) are kept in every variant: `no decision` is the limit with them.
Alongside `fast path`, the same on a second product whose codes all fall in one counter row (the
design without slots), so what the slots save a hot product shows in the same run; and both again
with the commit 2 ms after the statement, as on a disk that flushes (the throwaway cluster does not).

Each product holds 200,000 codes, far above its threshold (10): the hot path of a sale.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import uuid

import asyncpg

from _common import ROOT, bench_postgres, closed_loop, merged, report

from cutylib.config import with_database
from cutylib.db import migrate

MIGRATIONS = ROOT / "services" / "codepool" / "migrations"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
CONCURRENCY = 32
# The fast path again, on a product whose codes are all counted in one product_stock row: what the
# counter slots (codepool_stock_slot) save a hot product.
ONE_ROW = "fast path, one counter row"
# The same two with the commit 2 ms after the statement (a WAL flush on a real disk; the throwaway
# cluster runs with fsync off, so its commits cost nothing): how long a counter row stays locked is
# what serialises a hot product.
SLOW_COMMIT = 0.002
SLOW_SLOTS = "fast path, 16 counter rows, commit 2 ms later"
SLOW_ONE_ROW = "fast path, one counter row, commit 2 ms later"
RESERVE = ("UPDATE codes SET status = 'reserved', reserved_at = clock_timestamp() WHERE id = ("
           "SELECT id FROM codes WHERE merchant_id = 'm' AND product_id = $1 AND status = 'available' "
           "ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED)")
NO_DECISION = ("CREATE OR REPLACE FUNCTION codepool_stock_changed(p_changed jsonb) RETURNS void "
               "LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$")
# Every changed product's lock first (in product id order), then every product decided.
LOCK_ALWAYS = """
CREATE OR REPLACE FUNCTION codepool_stock_changed(p_changed jsonb) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT DISTINCT x->>'m' AS merchant_id, (x->>'p')::uuid AS product_id
             FROM jsonb_array_elements(p_changed) x ORDER BY 2 LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.product_id::text, 0));
    END LOOP;
    FOR p IN SELECT DISTINCT x->>'m' AS merchant_id, (x->>'p')::uuid AS product_id
             FROM jsonb_array_elements(p_changed) x ORDER BY 2 LOOP
        PERFORM codepool_check_stock(p.merchant_id, p.product_id);
    END LOOP;
END $$
"""


def decision_functions() -> dict[str, str]:
    return {
        "lock always": LOCK_ALWAYS,
        "fast path": (MIGRATIONS / "functions" / "codepool_stock_changed.sql").read_text(),
        "no decision (the limit)": NO_DECISION,
    }


async def stocked_product(conn: asyncpg.Connection, sku: str, *, one_slot: bool) -> uuid.UUID:
    """A product of 200,000 available codes, armed (above its threshold). `one_slot`: every code id
    ends in a zero byte, so all of them are counted in one product_stock row (codepool_stock_slot)."""
    pid, bid = uuid.uuid4(), uuid.uuid4()
    await conn.execute("INSERT INTO products (id, merchant_id, sku, name, price_minor, currency, low_stock_threshold) "
                       "VALUES ($1, 'm', $2, 'Hot product', 100, 'TRY', 10)", pid, sku)
    await conn.execute("INSERT INTO supplier_batches (id, merchant_id, product_id, batch_ref, received, imported, "
                       "content_digest, actor) VALUES ($1, 'm', $2, 'b', 1, 1, $3, 'bench')", bid, pid, os.urandom(32))
    code_id = ("encode(overlay(uuid_send(gen_random_uuid()) PLACING '\\x00'::bytea FROM 16), 'hex')::uuid"
               if one_slot else "gen_random_uuid()")
    # Code rows as the importer writes them, with stand-in bytes (nothing is decrypted here).
    await conn.execute(
        "INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash) "
        f"SELECT {code_id}, 'm', $1, $2, 'k', substr(decode(md5(g::text), 'hex'), 1, 12), "
        "decode(md5(g::text) || md5(g::text), 'hex'), decode(md5(g::text) || md5((g + 1)::text), 'hex') "
        "FROM generate_series(1, 200000) g", pid, bid)
    await conn.execute("UPDATE products SET stock_low = false WHERE id = $1", pid)
    return pid


async def reserve_slow_commit(pool: asyncpg.Pool, product_id: uuid.UUID) -> None:
    async with pool.acquire() as conn:
        async with conn.transaction():
            await conn.execute(RESERVE, product_id)
            await conn.execute("SELECT pg_sleep($1)", SLOW_COMMIT)


async def main() -> None:
    server = bench_postgres()
    dsn = with_database(server.dsn, f"cuty_stocklow_{uuid.uuid4().hex[:8]}")
    await migrate(dsn, pathlib.Path(MIGRATIONS))
    conn = await asyncpg.connect(dsn)
    pid = await stocked_product(conn, "hot", one_slot=False)
    one_row = await stocked_product(conn, "hot-one-row", one_slot=True)
    await conn.execute("VACUUM ANALYZE codes")
    pool = await asyncpg.create_pool(dsn, min_size=CONCURRENCY, max_size=CONCURRENCY)
    runs: dict[str, list] = {}
    try:
        for _ in range(ROUNDS):
            for name, fn in decision_functions().items():
                await conn.execute(fn)
                runs.setdefault(name, []).append(
                    await closed_loop(lambda i: pool.execute(RESERVE, pid), concurrency=CONCURRENCY, duration=SECONDS))
                if name == "fast path":
                    runs.setdefault(ONE_ROW, []).append(await closed_loop(
                        lambda i: pool.execute(RESERVE, one_row), concurrency=CONCURRENCY, duration=SECONDS))
                    for variant, product in ((SLOW_SLOTS, pid), (SLOW_ONE_ROW, one_row)):
                        runs.setdefault(variant, []).append(await closed_loop(
                            lambda i, product=product: reserve_slow_commit(pool, product), concurrency=CONCURRENCY,
                            duration=SECONDS))
    finally:
        await pool.close()
        await conn.close()
        server.close()
    limit = merged(runs["no decision (the limit)"])
    results = [merged(rs).result(f"reserve 1 code, hot product: {name}", CONCURRENCY, limit=limit,
                                 notes=f"{ROUNDS} rounds alternated: " + ", ".join(f"{r.ops_per_s:.0f}/s" for r in rs))
               for name, rs in runs.items()]
    report("stocklow", results)


if __name__ == "__main__":
    asyncio.run(main())
