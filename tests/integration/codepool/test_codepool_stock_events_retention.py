"""The code pool's outbox of merchant events (stock_events) in week partitions, on a database of its
own (docs/codepool.md, "Retention"): the migration keeps the events there were and the feed's
cursor reads on where it stopped; events stay append-only; a partition past the retention leaves
whole (archived first), never row by row; the setting is refused below the relay's minimum."""
from __future__ import annotations

import dataclasses
import datetime as dt
import pathlib
import shutil
import uuid

import asyncpg
import pytest
import pytest_asyncio

from codepool.bootstrap import STOCK_EVENTS_AHEAD, codepool_retention, create_codepool_pool
from codepool.stock_events import StockEvents
from cutylib.config import Settings, with_database
from cutylib.db import migrate
from cutylib.retention import Retention
from cutylib.testing.postgres import service_dsn
from cutylib.testing.retention import partitions
from cutylib.testing.tenancy import PARTITIONS_WITHOUT_RLS

REPO = pathlib.Path(__file__).resolve().parents[3]
MIGRATIONS = REPO / "services" / "codepool" / "migrations"
CONVERSION = "0310_stock_events_partitioned.sql"
TABLE = "stock_events"
MERCHANT = "merchant-outbox"
EMIT = "SELECT codepool_emit_event($1, $2, 'code.claimed', $3, '{}'::jsonb)"


@pytest_asyncio.fixture
async def db(pg, tmp_path):
    """A code pool database migrated up to the conversion, with events in the old table (one of them
    two months old), then converted: (owner connection, service pool, the product, the old seqs)."""
    before = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, before, ignore=shutil.ignore_patterns(CONVERSION))
    dsn = with_database(pg.dsn, f"codepool_outbox_{uuid.uuid4().hex[:10]}")
    await migrate(dsn, before)
    owner = await asyncpg.connect(dsn)
    await owner.execute("SELECT set_config('cuty.merchant', '*', false)")
    product = uuid.uuid4()
    await owner.execute("INSERT INTO products (id, sku, name, price_minor, currency, merchant_id) "
                        "VALUES ($1, 'sku-1', 'Card', 100, 'TRY', $2)", product, MERCHANT)
    await owner.fetchval(EMIT, MERCHANT, product, "order-1")
    await owner.execute("INSERT INTO stock_events (merchant_id, id, product_id, type, payload, created_at) "
                        "VALUES ($1, gen_random_uuid(), $2, 'stock.low', '{}', clock_timestamp() - interval '60 days')",
                        MERCHANT, product)
    await owner.fetchval(EMIT, MERCHANT, product, "order-2")
    old = [r["seq"] for r in await owner.fetch("SELECT seq FROM stock_events ORDER BY seq")]
    assert await migrate(dsn, MIGRATIONS) == [CONVERSION.removesuffix(".sql")]
    pool = await create_codepool_pool(await service_dsn(pg.dsn, "codepool", dsn),
                                      dataclasses.replace(Settings(), db_pool_min=1, db_pool_max=4))
    yield owner, pool, product, old
    await pool.close()
    await owner.close()


async def test_the_conversion_keeps_the_events_and_the_feed_reads_on(db):
    owner, pool, product, old = db
    parts = await partitions(owner, TABLE)
    legacy = parts.pop(f"{TABLE}_legacy")
    assert legacy[0] is None
    assert len(parts) == STOCK_EVENTS_AHEAD and all(hi - lo == dt.timedelta(days=7) for lo, hi in parts.values())
    assert await owner.fetchval("SELECT relkind::text FROM pg_class WHERE relname = $1", TABLE) == "p"
    assert await owner.fetch(PARTITIONS_WITHOUT_RLS) == []
    feed = StockEvents(pool)
    # The relay's cursor: every old event in seq order, then from any seq on.
    assert [e.seq for e in await feed.after(0, 100)] == old
    assert [e.seq for e in await feed.after(old[0], 100)] == old[1:]
    # A new event goes on after the old ones' seq, and the feed finds it.
    new_id = await pool.fetchval(EMIT, MERCHANT, product, "order-3")
    got = await feed.after(old[-1], 100)
    assert [e.id for e in got] == [str(new_id)] and got[0].seq > old[-1] and got[0].order_id == "order-3"
    # Still history: no event changed or deleted, the table not truncated.
    for sql in ("UPDATE stock_events SET payload = '{}'", "DELETE FROM stock_events", "TRUNCATE stock_events"):
        with pytest.raises(asyncpg.PostgresError, match="stock events are history"):
            await owner.execute(sql)
    # The feed merges the partitions' primary keys: no table scan, no sort.
    nodes = [r[0].strip().removeprefix("->").strip() for r in await owner.fetch(
        "EXPLAIN SELECT seq FROM stock_events WHERE seq > $1 ORDER BY seq LIMIT 100", old[0])]
    assert any(n.startswith("Merge Append") for n in nodes), nodes
    assert not any(n.startswith(("Seq Scan", "Sort  ")) for n in nodes), nodes


async def test_events_leave_by_partition_past_their_retention(db, tmp_path):
    owner, pool, product, old = db
    job = codepool_retention(pool)
    done = await job.round()
    assert done.dropped == [] and not any(p.startswith(f"{TABLE}_") for p in done.created)  # all made already
    # As if the retention had passed the legacy partition's end: it leaves whole, archived first.
    legacy_end = (await partitions(owner, TABLE))[f"{TABLE}_legacy"][1]
    assert await pool.fetchval("SELECT array_agg(p) FROM cuty_partitions_detach($1, $2, 1000) p",
                               TABLE, legacy_end) == [f"{TABLE}_legacy"]
    done = await Retention(pool, [t for t in job.tables if t.name == TABLE], tmp_path).round()
    assert done.dropped == [f"{TABLE}_legacy"]
    assert len((tmp_path / TABLE / f"{TABLE}_legacy.csv").read_text().splitlines()) == 1 + len(old)
    assert await StockEvents(pool).after(0, 100) == []
    # The outbox goes on: that round made this week's partition again (the legacy one had held this
    # week), and a new event is read after the cursor.
    assert any(lo <= dt.datetime.now(dt.timezone.utc) < hi for lo, hi in (await partitions(owner, TABLE)).values())
    await pool.fetchval(EMIT, MERCHANT, product, "order-4")
    assert [e.seq > old[-1] for e in await StockEvents(pool).after(old[-1], 100)] == [True]


def test_the_retention_setting_is_refused_below_a_week(monkeypatch):
    monkeypatch.setenv("CUTY_STOCK_EVENTS_RETENTION_DAYS", "6")
    with pytest.raises(ValueError, match="CUTY_STOCK_EVENTS_RETENTION_DAYS"):
        codepool_retention(None)
    for days in ("0", "7", "30"):
        monkeypatch.setenv("CUTY_STOCK_EVENTS_RETENTION_DAYS", days)
        assert {t.name: (t.retention_days, t.width_days) for t in codepool_retention(None).tables
                if t.name == TABLE} == {TABLE: (int(days), 7)}
