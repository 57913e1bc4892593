"""An Idempotency-Key's statements on the day-partitioned key table, by plan (`make bench-keyplans`).

PostgreSQL 15 locks every partition a cached generic plan names before it prunes them at execution,
so a key's FINISH (`UPDATE ... WHERE ... AND created_at = $4`, one partition) locks all of them once
its statement has a generic plan. A custom plan is pruned when it is planned and locks one, but is
planned on every call. This measures which costs a key more, on the payments schema as migrated,
with the table at the partition count of its defaults and more (the migration's partitions and
BENCH_KEYS_AHEAD days made ahead) and 200,000 keys of the last day in it:

- `generic (as the service runs)`: payments.checkout.idempotency's BEGIN and FINISH, the server's
  own plan choice (generic after five calls);
- `force_custom_plan, every statement`: the same statements on connections with
  plan_cache_mode = force_custom_plan (BEGIN's function plans its own statements custom too);
- `FINISH in a function with force_custom_plan`: FINISH's UPDATE inside a PL/pgSQL function with
  `SET plan_cache_mode = force_custom_plan` (only that statement custom, one partition locked).

A key's BEGIN + FINISH, 8 in flight, the variants alternated in BENCH_ROUNDS rounds of BENCH_SECONDS;
each variant's rate against the service's in the same run, and each statement's p50 / p99.
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid

import asyncpg

from _common import ROOT, Run, bench_postgres, closed_loop, merged, report

from cutylib.config import with_database
from cutylib.db import migrate
from payments.checkout.idempotency import BEGIN, FINISH

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "2"))
AHEAD = int(os.environ.get("BENCH_KEYS_AHEAD", "6"))
IN_FLIGHT = 8
CUSTOMERS = 2_000

FILL = """
INSERT INTO checkout_idempotency_keys (customer_id, operation, key, request_hash, resource_id, state, response,
                                       response_is_error, created_at, expires_at)
SELECT 'cust-' || (g % $2), 'create', 'k-' || g, sha256(g::text::bytea), gen_random_uuid(), 'done', '\\x0a00'::bytea,
       false, now() - interval '1 day' * (g::float8 / $1), now() + interval '1 day' - interval '1 day' * (g::float8 / $1)
FROM generate_series(1, $1::bigint) g
"""
FINISH_FUNCTION = """
CREATE FUNCTION bench_key_finish(p_customer text, p_operation text, p_key text, p_at timestamptz, p_response bytea,
                                 p_error boolean)
RETURNS void LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    UPDATE checkout_idempotency_keys SET state = 'done', response = p_response, response_is_error = p_error,
                                         locked_until = NULL
    WHERE customer_id = p_customer AND operation = p_operation AND key = p_key AND created_at = p_at
      AND state = 'in_flight';
END
$$
"""
SERVICE = "generic (as the service runs)"
CUSTOM = "force_custom_plan, every statement"
IN_FUNCTION = "FINISH in a function with force_custom_plan"


async def main() -> None:
    server = bench_postgres()
    try:
        dsn = with_database(server.dsn, f"cuty_payments_keys_{uuid.uuid4().hex[:6]}")
        await migrate(dsn, ROOT / "services" / "payments" / "migrations")
        conn = await asyncpg.connect(dsn)
        await conn.execute("SELECT cuty_partitions_ahead('checkout_idempotency_keys', 1, $1)", AHEAD)
        partitions = await conn.fetchval("SELECT count(*) FROM pg_inherits "
                                         "WHERE inhparent = 'checkout_idempotency_keys'::regclass")
        await conn.execute(FILL, 200_000, CUSTOMERS)
        await conn.execute(FINISH_FUNCTION)
        await conn.execute("VACUUM ANALYZE checkout_idempotency_keys")
        await conn.close()
        pools = {SERVICE: await asyncpg.create_pool(dsn, min_size=IN_FLIGHT, max_size=IN_FLIGHT),
                 CUSTOM: await asyncpg.create_pool(dsn, min_size=IN_FLIGHT, max_size=IN_FLIGHT,
                                                   server_settings={"plan_cache_mode": "force_custom_plan"}),
                 IN_FUNCTION: await asyncpg.create_pool(dsn, min_size=IN_FLIGHT, max_size=IN_FLIGHT)}
        runs: dict[str, list[Run]] = {name: [] for name in pools}
        statement_runs = {f"{name}: {what}": Run(0, 0.0, []) for name in pools for what in ("BEGIN", "FINISH")}

        def cycle(name: str, pool: asyncpg.Pool):
            async def op(i: int) -> None:
                key, customer = uuid.uuid4().hex, f"cust-{i % CUSTOMERS}"
                async with pool.acquire() as con:
                    t0 = time.perf_counter()
                    row = await con.fetchrow(BEGIN, customer, "create", key, b"\x01", uuid.uuid4(), 30.0, 86400.0)
                    t1 = time.perf_counter()
                    if name == IN_FUNCTION:
                        await con.execute("SELECT bench_key_finish($1, $2, $3, $4, $5, $6)", customer, "create",
                                          key, row["created_at"], b"\x0a\x00", False)
                    else:
                        await con.execute(FINISH, customer, "create", key, row["created_at"], b"\x0a\x00", False)
                    t2 = time.perf_counter()
                for what, ms in (("BEGIN", t1 - t0), ("FINISH", t2 - t1)):
                    r = statement_runs[f"{name}: {what}"]
                    r.ops += 1
                    r.latencies_ms.append(ms * 1000)
            return op

        for name, pool in pools.items():  # each pool's connections warmed (plans cached), not measured
            await closed_loop(cycle(name, pool), concurrency=IN_FLIGHT, total=20 * IN_FLIGHT)
        for stats in statement_runs.values():
            stats.ops, stats.latencies_ms = 0, []
        for rnd in range(ROUNDS):
            order = list(pools.items()) if rnd % 2 == 0 else list(reversed(pools.items()))
            for name, pool in order:
                runs[name].append(await closed_loop(cycle(name, pool), concurrency=IN_FLIGHT, duration=SECONDS))
        for pool in pools.values():
            await pool.close()
    finally:
        server.close()

    service = merged(runs[SERVICE])
    results = [merged(runs[name]).result(f"key BEGIN + FINISH, {name}", IN_FLIGHT, limit=service,
                                         notes=f"{ROUNDS} rounds") for name in pools]
    for name, r in statement_runs.items():
        results.append(r.result(f"{name} alone (in the loop above)", IN_FLIGHT))
    results[0].extra.update({"partitions": partitions, "load_average": os.getloadavg()})
    report("keyplans", results)


if __name__ == "__main__":
    asyncio.run(main())
