"""Every filter of ListCheckouts is answered from an index that leads with it: a merchant's (or the
operator's) list of a rare finished state among many rows reads the rows it returns, not the merchant's
whole history (EXPLAIN ANALYZE on a real table; docs/checkout.md, "Lists")."""
from __future__ import annotations

import json

import asyncpg
import pytest

from payments.checkout.repository import ListQuery, list_statement

MERCHANT = "merchant-list-plan"


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize("query", [
    ListQuery(merchant_id=MERCHANT, state="REFUNDED"),
    ListQuery(state="REFUNDED"),  # the operator's, across merchants
], ids=["merchant", "operator"])
async def test_a_list_of_a_rare_state_reads_only_its_rows(payments_dsn, query):
    conn = await asyncpg.connect(payments_dsn)
    tx = conn.transaction()
    await tx.start()
    try:
        for (name,) in await conn.fetch("SELECT conname FROM pg_constraint WHERE conrelid = 'checkouts'::regclass "
                                        "AND contype = 'c' AND conname <> 'checkouts_state_check'"):
            await conn.execute(f'ALTER TABLE checkouts DROP CONSTRAINT "{name}"')
        # 20,000 completed checkouts of the merchant and others, and 20 refunded (a finished state: no
        # partial index of the live states helps).
        await conn.execute(
            "INSERT INTO checkouts (id, customer_id, kind, state, payment_key, merchant_id, created_at) "
            "SELECT gen_random_uuid(), 'c-' || (i % 500), 'booking', "
            "       CASE WHEN i % 1000 = 0 THEN 'REFUNDED' ELSE 'COMPLETED' END, gen_random_uuid(), "
            "       CASE WHEN i % 4 = 0 THEN 'other-merchant' ELSE $1 END, "
            "       clock_timestamp() - make_interval(secs => i) "
            "FROM generate_series(1, 20000) i", MERCHANT)
        await conn.execute("ANALYZE checkouts")
        sql, args = list_statement(query, None, 100)
        (doc,) = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args))
        nodes = list(_nodes(doc["Plan"]))
        scans = [n for n in nodes if n.get("Relation Name") == "checkouts"]
        removed = sum(n.get("Rows Removed by Filter", 0) for n in scans)
        assert removed < 200, (removed, [(n["Node Type"], n.get("Index Name")) for n in scans])
        assert all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan") for n in scans), scans
    finally:
        await tx.rollback()
        await conn.close()
