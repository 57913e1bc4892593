"""The code pool's incident story, measured (`make bench-incident`).

On one database with a product of BENCH_INCIDENT_CODES codes (half sold, each with its order and
delivery) and BENCH_INCIDENT_MERCHANTS small merchants of one product each:
  * what the history index costs the hot path: reserve + release of one code (ReservationService,
    the service's own statements) at 8 in flight, with `deliveries_by_code` and without it (dropped
    and built again between rounds, alternated);
  * `ops code` lookups (codepool/incident.py `look_up`, audit included) by code value, code id and
    order id, one at a time, against the raw probe of the value's keyed hash in one product (the
    limit: what finding a code costs at all).

    python bench/incident.py       (BENCH_INCIDENT_CODES, BENCH_INCIDENT_MERCHANTS, BENCH_ROUNDS, BENCH_SECONDS)
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import time
import uuid

from _common import ROOT, bench_postgres, closed_loop, merged, report

import asyncpg

from codepool.domain import ReserveCommand
from codepool.incident import look_up
from codepool.keys import Keyring
from codepool.service import ReservationService
from cutylib.config import Settings, with_database
from cutylib.db import ALL_MERCHANTS, create_pool, migrate
from growth import Product, fill, fill_merchants

MIGRATIONS = ROOT / "services" / "codepool" / "migrations"
CODES = int(os.environ.get("BENCH_INCIDENT_CODES", "200000"))
MERCHANTS = int(os.environ.get("BENCH_INCIDENT_MERCHANTS", "500"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
IN_FLIGHT = 8
LOOKUPS = 100
PROBE = "SELECT id FROM codes WHERE merchant_id = $1 AND product_id = $2 AND code_hash = $3"
DROP = "DROP INDEX IF EXISTS deliveries_by_code"
BUILD = "CREATE INDEX IF NOT EXISTS deliveries_by_code ON deliveries (merchant_id, code_id)"


async def known_code(conn, keyring: Keyring, p: Product, value: str) -> tuple[uuid.UUID, str]:
    """One more code of the big product with a real value (encrypted and hashed as the importer
    does), sold to an order of its own: (code id, order id)."""
    code_id, order_id = uuid.uuid4(), f"bench-known-{uuid.uuid4().hex[:8]}"
    key_id, nonce, ct = keyring.encrypt(code_id.bytes, p.id.bytes, value)
    batch = await conn.fetchval("SELECT id FROM supplier_batches WHERE merchant_id = $1 AND product_id = $2",
                                p.merchant, p.id)
    await conn.execute("INSERT INTO codes (id, merchant_id, product_id, batch_id, key_id, nonce, ciphertext, code_hash, "
                       "status, reserved_at, delivered_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'delivered', "
                       "clock_timestamp(), clock_timestamp())",
                       code_id, p.merchant, p.id, batch, key_id, nonce, ct, keyring.code_hash(value))
    await conn.execute("INSERT INTO reservations (merchant_id, order_id, order_item_id, product_id, customer_id, quantity, "
                       "unit_price_minor, currency, status, reserved_at, expires_at, delivered_at, payment_transaction_id) "
                       "VALUES ($1, $2, $2 || '/1', $3, 'cust-known', 1, 500, 'TRY', 'delivered', clock_timestamp(), "
                       "clock_timestamp() + interval '15 minutes', clock_timestamp(), 'tx-known')",
                       p.merchant, order_id, p.id)
    await conn.execute("INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, "
                       "status, reserved_at, delivered_at) VALUES ($1, $2, $2 || '/1', $3, 'cust-known', $4, 'delivered', "
                       "clock_timestamp(), clock_timestamp())", p.merchant, order_id, p.id, code_id)
    return code_id, order_id


async def main() -> None:
    server = bench_postgres()
    dsn = with_database(server.dsn, f"cuty_incident_{uuid.uuid4().hex[:8]}")
    await migrate(dsn, pathlib.Path(MIGRATIONS))
    keyring = Keyring(keys={"b1": os.urandom(32)}, active="b1", hash_key=os.urandom(32))
    big = Product("big", "m-big", CODES, 0.5)
    conn = await asyncpg.connect(dsn)
    print(f"filling: {CODES:,} codes (half sold), {MERCHANTS:,} more merchants", flush=True)
    await fill(conn, big)
    await fill_merchants(conn, MERCHANTS)
    # One code per lookup scenario: each lookup is audited, and the audit entries are part of the
    # code's story, so a code looked up N times tells N more entries.
    known = {what: await known_code(conn, keyring, big, f"BENCH-INCIDENT-{what.replace(' ', '-').upper()}")
             for what in ("code value", "code id", "order id")}
    await conn.execute("VACUUM ANALYZE")
    pool = await create_pool(dsn, min_size=IN_FLIGHT, max_size=IN_FLIGHT + 2, merchant=ALL_MERCHANTS)
    service = ReservationService(pool, ttl_seconds=60, max_active=10 ** 6)
    results = []

    async def reserve_release(i: int) -> None:
        order = f"bench-{uuid.uuid4().hex}"
        await service.reserve(ReserveCommand(order, order + "/1", big.id, 1, f"c-{i % 1000}"), "system")
        await service.release(order, "system")

    runs: dict[str, list] = {"with deliveries_by_code": [], "without it": []}
    for _ in range(ROUNDS):
        for variant in runs:
            await conn.execute(BUILD if variant.startswith("with ") else DROP)
            runs[variant].append(await closed_loop(reserve_release, concurrency=IN_FLIGHT, duration=SECONDS))
    await conn.execute(BUILD)
    without = merged(runs["without it"])
    for variant, r in runs.items():
        results.append(merged(r).result(f"reserve + release, {variant}", IN_FLIGHT, limit=without,
                                        notes="limit: the same without the index (alternated rounds)"))

    value = "BENCH-INCIDENT-CODE-VALUE"
    probe = await closed_loop(lambda i: conn.fetch(PROBE, big.merchant, big.id, keyring.code_hash(value)),
                              concurrency=1, total=LOOKUPS)
    for what, (code_id, order_id) in known.items():
        query = {"code value": value, "code id": str(code_id), "order id": order_id}[what]
        t0 = time.perf_counter()
        run = await closed_loop(lambda i: look_up(pool, keyring, query, by="bench"), concurrency=1, total=LOOKUPS)
        story = await look_up(pool, keyring, query, by="bench")
        assert story.matched == what and story.codes and story.codes[0].code["id"] == str(code_id), (what, story.matched)
        results.append(run.result(f"ops code by {what}", 1, limit=probe,
                                  notes=f"{MERCHANTS + 1} products; limit: the keyed-hash probe of one product",
                                  seconds=round(time.perf_counter() - t0, 2)))
    await pool.close()
    await conn.close()
    report("incident", results)
    print(f"figures under {Settings().db_pool_max}-connection pools on a {os.cpu_count()}-core machine; "
          "compare the rows of one run only")


if __name__ == "__main__":
    asyncio.run(main())
