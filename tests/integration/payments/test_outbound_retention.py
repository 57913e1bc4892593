"""Retention of outbound events (docs/webhooks-out.md, "Retention"), on a database of its own: an
event whose deliveries all finished long ago moves with its deliveries and attempt log into the
time-partitioned histories, the endpoint's delivery log reads as before, the histories leave whole
by partition past their retention, no event leaves by a DELETE, and the mover racing redeliveries
loses nothing (checked in the database afterwards)."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import random
import uuid

import asyncpg
import pytest
import pytest_asyncio

from cutylib.config import Settings
from cutylib.principal import Principal
from cutylib.retention import Move, Retention, Table
from cutylib.testing.retention import columns, fresh_database, moving
from cutylib.testing.tenancy import PARTITIONS_WITHOUT_RLS
from payments.bootstrap import OUTBOUND_HISTORIES, create_payments_pool, payments_retention
from payments.outbound.repository import Endpoints

REPO = __import__("pathlib").Path(__file__).resolve().parents[3]
EVERYTHING = Move("merchant_events", "merchant_events_move", -3650)
MERCHANT = "merchant-retention"
ADMIN = Principal("admin-retention", "admin", MERCHANT)
DAY = dt.timedelta(days=1)


@pytest_asyncio.fixture
async def fresh(pg):
    dsn, as_service = await fresh_database(pg.dsn, "payments", REPO)
    owner = await asyncpg.connect(dsn)
    pool = await create_payments_pool(as_service, dataclasses.replace(Settings(), db_pool_min=2, db_pool_max=12))
    endpoint = uuid.uuid4()
    await pool.execute("INSERT INTO webhook_endpoints (merchant_id, id, url, events, created_by, secret_key_id, "
                       "secret_nonce, secret_ciphertext) VALUES ($1, $2, 'https://example.com/hook', "
                       "'{checkout.completed}', 'test', 'k', $3, $4)", MERCHANT, endpoint, b"n" * 12, b"c" * 32)
    yield owner, pool, endpoint
    await pool.close()
    await owner.close()


async def publish(pool, endpoint, *, age: dt.timedelta, state: str | None = "delivered", attempts: int = 1) -> uuid.UUID:
    """An event created `age` ago and (state not None) its delivery to `endpoint`, finished as long
    ago as it was created, with its attempt log."""
    event = uuid.uuid4()
    async with pool.acquire() as conn, conn.transaction():
        now = await conn.fetchval("SELECT clock_timestamp()")
        await conn.execute("INSERT INTO merchant_events (merchant_id, id, type, payload, created_at) "
                           "VALUES ($1, $2, 'checkout.completed', $3::jsonb, $4)", MERCHANT, event,
                           json.dumps({"id": str(event)}), now - age)
        if state is None:
            return event
        delivery = await conn.fetchval(
            "INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, state, attempts, next_attempt_at, "
            "give_up_at, delivered_at, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
            MERCHANT, endpoint, event, state, attempts, now if state == "pending" else None, now - age + 3 * DAY,
            now - age + DAY if state == "delivered" else None, now - age)
        for a in range(1, attempts + 1):
            await conn.execute("INSERT INTO webhook_attempts (merchant_id, delivery_id, attempt, worker, started_at, "
                               "http_status) VALUES ($1, $2, $3, 'w', $4, $5)", MERCHANT, delivery, a,
                               now - age + a * dt.timedelta(minutes=1), 200 if a == attempts else 500)
    return event


async def where(owner, event) -> str:
    live = await owner.fetchval("SELECT count(*) FROM merchant_events WHERE id = $1", event)
    moved = await owner.fetchval("SELECT count(*) FROM merchant_events_history WHERE id = $1", event)
    return {(1, 0): "live", (0, 1): "history"}.get((live, moved), f"live {live}, history {moved}")


async def log(pool, endpoint) -> list:
    out, before = [], 0
    while True:
        page = await Endpoints(pool).deliveries(ADMIN, MERCHANT, str(endpoint), before, 2)
        out += page
        if len(page) < 2:
            return out
        before = page[-1].seq


async def test_finished_events_move_with_their_deliveries_and_the_log_reads_as_before(fresh, tmp_path):
    owner, pool, endpoint = fresh
    delivered = await publish(pool, endpoint, age=40 * DAY, attempts=2)
    failed = await publish(pool, endpoint, age=45 * DAY, state="failed", attempts=3)
    unsent = await publish(pool, endpoint, age=50 * DAY, state=None)  # no endpoint took it
    pending = await publish(pool, endpoint, age=60 * DAY, state="pending")  # redelivered: still live
    recent = await publish(pool, endpoint, age=2 * DAY)
    recent_unsent = await publish(pool, endpoint, age=2 * DAY, state=None)
    before = await log(pool, endpoint)
    assert len(before) == 4 and [len(d.attempt_log) for d in before] == [1, 1, 3, 2]

    done = await payments_retention(pool).round()  # 30 days after their deliveries finished
    assert done.moved == {"merchant_events": 3}
    assert await where(owner, recent_unsent) == "live"
    assert {e: await where(owner, e) for e in (delivered, failed, unsent, pending, recent)} == {
        delivered: "history", failed: "history", unsent: "history", pending: "live", recent: "live"}
    assert await owner.fetchval("SELECT count(*) FROM webhook_attempts_history") == 5
    assert await owner.fetchval("SELECT count(*) FROM webhook_deliveries_history") == 2
    assert await owner.fetch(PARTITIONS_WITHOUT_RLS) == []
    assert await log(pool, endpoint) == before

    # No event leaves by a DELETE, from the live table or the history; the history is never changed.
    for sql, arg in (("DELETE FROM merchant_events WHERE id = $1", recent_unsent),
                     ("DELETE FROM merchant_events_history WHERE id = $1", delivered),
                     ("UPDATE webhook_deliveries_history SET state = 'pending' WHERE event_id = $1", delivered),
                     ("DELETE FROM webhook_attempts_history WHERE merchant_id = $1", MERCHANT)):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await pool.execute(sql, arg)

    # Past the retention, the partition holding the moved rows leaves whole from each history, archived.
    upper = await owner.fetchval("SELECT min(upper) FROM cuty_partition_bounds('merchant_events_history')")
    days = -((upper - await owner.fetchval("SELECT clock_timestamp()")).days + 1)
    done = await Retention(pool, [Table(t, days) for t in OUTBOUND_HISTORIES], tmp_path).round()
    assert sorted(done.dropped) == sorted(f"{t}_legacy" for t in OUTBOUND_HISTORIES)
    archived = (tmp_path / "webhook_attempts_history" / "webhook_attempts_history_legacy.csv").read_text()
    assert len(archived.splitlines()) == 1 + 5
    assert [d.event_id for d in await log(pool, endpoint)] == [str(recent), str(pending)]


async def test_the_histories_have_every_column_of_their_tables_in_order(fresh):
    owner, _, _ = fresh
    for t in OUTBOUND_HISTORIES:
        live = await columns(owner, t.removesuffix("_history"))
        assert await columns(owner, t) == live + [("moved_at", "timestamp with time zone")]


async def test_the_mover_racing_redeliveries_loses_nothing(fresh):
    owner, pool, endpoint = fresh
    events = [await publish(pool, endpoint, age=40 * DAY, attempts=1 + i % 3) for i in range(120)]
    rnd = random.Random(26)
    redelivered = set()

    async def redeliver(share):
        for e in share:
            n = await pool.execute("UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = clock_timestamp(), "
                                   "delivered_at = NULL WHERE merchant_id = $1 AND event_id = $2", MERCHANT, e)
            if n == "UPDATE 1":
                redelivered.add(e)
            await asyncio.sleep(0)

    picks = rnd.sample(events, 60)
    async with moving(Retention(pool, [], None, [EVERYTHING], batch=4, limit=20), "merchant_events") as mover:
        await asyncio.gather(*(redeliver(picks[i::3]) for i in range(3)))
    moved = mover["moved"]
    moved += (await Retention(pool, [], None, [EVERYTHING], batch=500).round()).moved["merchant_events"]

    places = {e: await where(owner, e) for e in events}
    assert set(places.values()) <= {"live", "history"}
    # A redelivery that found its delivery keeps the event live, pending; every other one moved.
    assert {e for e, p in places.items() if p == "live"} == redelivered
    assert moved == len(events) - len(redelivered)
    assert await owner.fetchval("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'") == len(redelivered)
    # Every delivery and attempt is somewhere, once.
    total = sum(1 + i % 3 for i in range(120))
    assert await owner.fetchval("SELECT (SELECT count(*) FROM webhook_attempts) + "
                                "(SELECT count(*) FROM webhook_attempts_history)") == total
    assert await owner.fetchval("SELECT (SELECT count(*) FROM webhook_deliveries) + "
                                "(SELECT count(*) FROM webhook_deliveries_history)") == 120
