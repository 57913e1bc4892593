"""Every filter of ListCheckouts is answered from an index that leads with it: a merchant's (or the
operator's) list of a rare finished state among many rows reads the rows it returns, not the merchant's
whole history (EXPLAIN ANALYZE on a real table; docs/checkout.md, "Lists")."""
from __future__ import annotations

import json

import asyncpg
import pytest

from cutylib.testing.plans import nodes
from payments.checkout.repository import ListQuery, list_statement

MERCHANT = "merchant-list-plan"


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
        scans = [n for n in nodes(doc["Plan"]) if n.get("Relation Name") == "checkouts"]
        removed = sum(n.get("Rows Removed by Filter", 0) for n in scans)
        assert removed < 200, (removed, [(n["Node Type"], n.get("Index Name")) for n in scans])
        assert all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan") for n in scans), scans
    finally:
        await tx.rollback()
        await conn.close()


async def test_a_page_joins_the_payments_of_its_own_checkouts_only_whatever_the_plan(own_database):
    """A page of a salon's 2,000 checkouts, planned as the planner may when it expects fewer rows than
    a page (the matching checkouts read and sorted, forced here): the payments are joined to the
    page's rows only, not to every checkout of the salon. On a database of its own: in the shared
    one, what other tests left in payments could turn the join around."""
    conn = await asyncpg.connect(await own_database("payments"))
    tx = conn.transaction()
    await tx.start()
    try:
        for (name,) in await conn.fetch("SELECT conname FROM pg_constraint WHERE conrelid = 'checkouts'::regclass "
                                        "AND contype IN ('c', 'f') AND conname <> 'checkouts_state_check'"):
            await conn.execute(f'ALTER TABLE checkouts DROP CONSTRAINT "{name}"')
        salon = await conn.fetchval("SELECT gen_random_uuid()")
        await conn.execute(
            "INSERT INTO checkouts (id, customer_id, kind, state, payment_key, payment_id, merchant_id, salon_id, "
            "created_at) SELECT gen_random_uuid(), 'c-' || (i % 500), 'booking', 'COMPLETED', gen_random_uuid(), "
            "gen_random_uuid(), $1, $2, clock_timestamp() - make_interval(secs => i) "
            "FROM generate_series(1, 2000) i", MERCHANT, salon)
        await conn.execute("ANALYZE checkouts")
        await conn.execute("SET LOCAL enable_indexscan = off")
        sql, args = list_statement(ListQuery(merchant_id=MERCHANT, salon_id=salon), None, 51)
        (doc,) = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args))
        joins = [n for n in nodes(doc["Plan"]) if n["Node Type"] in ("Nested Loop", "Hash Join", "Merge Join")]
        assert joins
        for join in joins:  # the checkouts side of the join: the page, not the salon's 2,000
            assert join["Plans"][0]["Actual Rows"] <= 51, [(n["Node Type"], n["Actual Rows"]) for n in join["Plans"]]
        assert len(await conn.fetch(sql, *args)) == 51
    finally:
        await tx.rollback()
        await conn.close()
