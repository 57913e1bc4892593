"""The key tables in time partitions, on a database of their own: the checkout API's
Idempotency-Keys by day (docs/checkout.md, "Idempotency-Key") and the PSP's webhook events by week
(docs/payments.md, "Webhooks"). The migrations keep the rows there were (a key's answer still
replayed, an event's redelivery still a duplicate), a key has one live use and an event id one row
across partitions even when requests race, a key used again after it expired is a new request, and
rows leave a partition at a time, past their retention, never row by row."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import pathlib
import shutil
import uuid

import asyncpg
import pytest
import pytest_asyncio

from cutylib import errors
from cutylib.config import Settings, with_database
from cutylib.db import migrate
from cutylib.retention import Retention
from cutylib.testing.postgres import service_dsn
from cutylib.testing.retention import partitions as table_partitions
from payments.bootstrap import IDEMPOTENCY_KEYS_AHEAD, create_payments_pool, payments_retention
from payments.checkout.idempotency import IdempotencyStore, Replay, request_hash

REPO = pathlib.Path(__file__).resolve().parents[3]
MIGRATIONS = REPO / "services" / "payments" / "migrations"
CONVERSION = "0190_idempotency_keys_partitioned.sql"
EVENTS_CONVERSION = "0191_psp_events_partitioned.sql"
TABLE = "checkout_idempotency_keys"
EVENTS = "psp_events"
STORE_EVENT = "SELECT psp_events_store($1, 'payment_intent.succeeded', NULL, '{}'::jsonb, $2, 5)"
# The request's first write, as the checkout API's are (idempotency.begin_with): here it writes
# nothing, and holds the key's statement open a moment so racing requests overlap.
FIRST = ("first AS (SELECT pg_sleep(0.02) AS slept FROM began)", ())


def store(pool, ttl: float = 3600.0) -> IdempotencyStore:
    return IdempotencyStore(pool, lease_seconds=30.0, ttl_seconds=ttl, encode=lambda answer: answer)


async def use(keys: IdempotencyStore, customer: str, key: str, req: str, answer: bytes = b"first answer"):
    """One request with `key`: its answer, the stored answer it replays, or the error it meets."""
    try:
        async with keys.claim(customer, "create", key, request_hash("create", req), FIRST) as claim:
            claim.finish(answer)
        return ("answered", claim.resource_id)
    except Replay as r:
        return ("replayed", r.response)
    except errors.DomainError as e:
        return (e.reason, None)


async def partitions(owner, table: str = TABLE) -> dict[str, tuple]:
    return await table_partitions(owner, table)


@pytest_asyncio.fixture
async def db(pg, tmp_path):
    """A payments database migrated up to the conversions, with keys and PSP events in the old tables,
    then converted: (owner connection, service pool, the keys written before)."""
    before = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, before, ignore=shutil.ignore_patterns(CONVERSION, EVENTS_CONVERSION))
    dsn = with_database(pg.dsn, f"payments_keys_{uuid.uuid4().hex[:10]}")
    await migrate(dsn, before)
    owner = await asyncpg.connect(dsn)
    old = {"done": str(uuid.uuid4()), "running": str(uuid.uuid4()), "dead": str(uuid.uuid4())}
    for name, key in old.items():
        await owner.execute(
            f"INSERT INTO {TABLE} (customer_id, operation, key, request_hash, resource_id, state, response, "
            "response_is_error, locked_until, created_at, expires_at) VALUES ('cust-old', 'create', $1, $2, $3, $4, "
            "$5, $6, $7, clock_timestamp() - $8::interval, clock_timestamp() - $8::interval + interval '1 day')",
            key, request_hash("create", name), uuid.uuid4(), "in_flight" if name == "running" else "done",
            None if name == "running" else b"stored " + name.encode(), None if name == "running" else False,
            dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5) if name == "running" else None,
            dt.timedelta(days=2) if name == "dead" else dt.timedelta(hours=1))
    # Events of before: handled a month ago, handled today, and one still to be handled.
    for name, status, age in (("evt_month", "processed", "29 days"), ("evt_today", "ignored", "1 hour"),
                              ("evt_due", "received", "1 minute")):
        await owner.execute(
            "INSERT INTO psp_events (event_id, type, payload, status, received_at, processed_at, next_attempt_at) "
            "VALUES ($1, 'payment_intent.succeeded', '{}'::jsonb, $2, clock_timestamp() - $3::text::interval, "
            "CASE WHEN $2 <> 'received' THEN clock_timestamp() END, CASE WHEN $2 = 'received' THEN clock_timestamp() END)",
            name, status, age)
    assert await migrate(dsn, MIGRATIONS) == [CONVERSION.removesuffix(".sql"), EVENTS_CONVERSION.removesuffix(".sql")]
    pool = await create_payments_pool(await service_dsn(pg.dsn, "payments", dsn),
                                      dataclasses.replace(Settings(), db_pool_min=2, db_pool_max=12))
    yield owner, pool, old
    await pool.close()
    await owner.close()


async def test_the_conversion_keeps_the_keys_and_their_answers(db):
    owner, pool, old = db
    parts = await partitions(owner)
    legacy = parts.pop(f"{TABLE}_legacy")
    # The old rows, all of them, in the legacy partition of everything before tomorrow (UTC); then
    # one-day partitions a week ahead.
    assert legacy[0] is None and legacy[1] > dt.datetime.now(dt.timezone.utc)
    assert len(parts) == IDEMPOTENCY_KEYS_AHEAD and all(hi - lo == dt.timedelta(days=1) for lo, hi in parts.values())
    assert await owner.fetchval(f"SELECT count(*) FROM ONLY {TABLE}_legacy") == 3
    assert await owner.fetchval("SELECT relkind::text FROM pg_class WHERE relname = $1", TABLE) == "p"

    keys = store(pool)
    # Inside its lifetime a key answers as before: the stored answer, the running request, the reuse error.
    assert await use(keys, "cust-old", old["done"], "done") == ("replayed", b"stored done")
    assert await use(keys, "cust-old", old["running"], "running") == ("idempotency-key-in-flight", None)
    assert await use(keys, "cust-old", old["done"], "another request") == ("idempotency-key-reused", None)
    # The key that had expired is a new request: a new row beside the dead one, answered and replayed.
    first = await use(keys, "cust-old", old["dead"], "dead", b"new answer")
    assert first[0] == "answered"
    assert await use(keys, "cust-old", old["dead"], "dead") == ("replayed", b"new answer")
    rows = await owner.fetch(f"SELECT state, expires_at > clock_timestamp() AS live FROM {TABLE} WHERE key = $1 "
                             "ORDER BY created_at", old["dead"])
    assert [(r["state"], r["live"]) for r in rows] == [("done", False), ("done", True)]


async def test_a_live_key_in_another_partition_is_the_same_key(db):
    """The primary key holds created_at, so it would take a second row of a key in another partition:
    the key's function finds the live one wherever it is."""
    owner, pool, _ = db
    tomorrow = max(hi for _, hi in (await partitions(owner)).values() if hi) - dt.timedelta(days=IDEMPOTENCY_KEYS_AHEAD)
    key = str(uuid.uuid4())
    await owner.execute(
        f"INSERT INTO {TABLE} (customer_id, operation, key, request_hash, resource_id, state, response, "
        "response_is_error, created_at, expires_at) VALUES ('cust', 'create', $1, $2, $3, 'done', 'elsewhere', false, "
        "$4, clock_timestamp() + interval '1 hour')", key, request_hash("create", "r"), uuid.uuid4(),
        tomorrow + dt.timedelta(hours=1))
    assert await owner.fetchval(f"SELECT tableoid::regclass::text FROM {TABLE} WHERE key = $1", key) != f"{TABLE}_legacy"
    assert await use(store(pool), "cust", key, "r") == ("replayed", b"elsewhere")
    assert await owner.fetchval(f"SELECT count(*) FROM {TABLE} WHERE key = $1", key) == 1


async def test_racing_requests_with_one_key_make_one_use(db):
    owner, pool, _ = db
    keys = store(pool)
    key = str(uuid.uuid4())
    outcomes = await asyncio.gather(*(use(keys, "cust-race", key, "r", f"answer {i}".encode()) for i in range(16)))
    answered = [o for o in outcomes if o[0] == "answered"]
    assert len(answered) == 1
    assert {o[0] for o in outcomes} <= {"answered", "replayed", "idempotency-key-in-flight"}
    rows = await owner.fetch(f"SELECT response, resource_id::text AS resource FROM {TABLE} "
                             "WHERE customer_id = 'cust-race' AND key = $1", key)
    assert len(rows) == 1 and rows[0]["resource"] == answered[0][1]
    assert all(o[1] == rows[0]["response"] for o in outcomes if o[0] == "replayed")

    # A key that expired, raced again: one new use, the dead row untouched beside it.
    short = store(pool, ttl=0.2)
    dead = str(uuid.uuid4())
    assert (await use(short, "cust-race", dead, "r"))[0] == "answered"
    await asyncio.sleep(0.3)
    outcomes = await asyncio.gather(*(use(keys, "cust-race", dead, "r", b"second use") for _ in range(16)))
    assert [o[0] for o in outcomes].count("answered") == 1
    rows = await owner.fetch(f"SELECT response, expires_at > clock_timestamp() AS live FROM {TABLE} "
                             "WHERE customer_id = 'cust-race' AND key = $1 ORDER BY created_at", dead)
    assert [(bytes(r["response"]), r["live"]) for r in rows] == [(b"first answer", False), (b"second use", True)]


async def test_dead_keys_leave_by_partition_past_their_retention(db, tmp_path, monkeypatch):
    owner, pool, old = db
    job = payments_retention(pool)
    done = await job.round()
    assert done.dropped == [] and not any(p.startswith(f"{TABLE}_") for p in done.created)  # all made already
    live = str(uuid.uuid4())
    assert (await use(store(pool), "cust", live, "r"))[0] == "answered"

    # As if the retention had passed the legacy partition's end (tomorrow + 2 days): it leaves whole.
    legacy_end = (await partitions(owner))[f"{TABLE}_legacy"][1]
    assert await pool.fetchval("SELECT array_agg(p) FROM cuty_partitions_detach($1, $2, 1000) p",
                               TABLE, legacy_end) == [f"{TABLE}_legacy"]
    done = await Retention(pool, [t for t in job.tables if t.name == TABLE], tmp_path).round()
    assert done.dropped == [f"{TABLE}_legacy"]
    assert len((tmp_path / TABLE / f"{TABLE}_legacy.csv").read_text().splitlines()) == 1 + 4
    # Gone with it: every key of before, including the one first used today. A key reused after its
    # partition left is a new request (the retention is at least the keys' lifetime, so in production
    # a partition leaves only once every key in it is dead).
    assert await owner.fetchval(f"SELECT count(*) FROM {TABLE}") == 0
    assert (await use(store(pool), "cust-old", old["done"], "done"))[0] == "answered"

    # Nothing purges row by row, and the retention cannot be set below the keys' lifetime.
    monkeypatch.setenv("CUTY_IDEMPOTENCY_TTL_SECONDS", str(3 * 86400))
    with pytest.raises(ValueError, match="CUTY_CHECKOUT_IDEMPOTENCY_KEYS_RETENTION_DAYS"):
        payments_retention(pool)
    monkeypatch.setenv("CUTY_CHECKOUT_IDEMPOTENCY_KEYS_RETENTION_DAYS", "0")
    assert [t.retention_days for t in payments_retention(pool).tables if t.name == TABLE] == [0]


async def test_psp_events_are_kept_by_week_and_an_event_id_is_stored_once(db, tmp_path):
    owner, pool, _ = db
    parts = await partitions(owner, EVENTS)
    legacy = parts.pop(f"{EVENTS}_legacy")
    assert legacy[0] is None and legacy[1] > dt.datetime.now(dt.timezone.utc)
    assert all(hi - lo == dt.timedelta(days=7) for lo, hi in parts.values())
    assert await owner.fetchval(f"SELECT count(*) FROM ONLY {EVENTS}_legacy") == 3
    # The event still due is found by the retry worker's claim, as before the conversion.
    from payments.webhooks import CLAIM_PSP_EVENTS
    assert [r["event_id"] for r in await pool.fetch(CLAIM_PSP_EVENTS, 10, 5.0)] == ["evt_due"]

    # A redelivery of an event of before is a duplicate; a new event is stored once, however many
    # deliveries of it race.
    assert await pool.fetchval(STORE_EVENT, "evt_month", "processed") is False
    stored = await asyncio.gather(*(pool.fetchval(STORE_EVENT, "evt_new", "processed") for _ in range(16)))
    assert stored.count(True) == 1
    assert await owner.fetchval(f"SELECT count(*) FROM {EVENTS} WHERE event_id = 'evt_new'") == 1
    # An id stored in another partition (its primary key holds received_at) is the same event.
    later = max(hi for _, hi in parts.values()) - dt.timedelta(days=1)
    await owner.execute(f"INSERT INTO {EVENTS} (event_id, type, payload, status, received_at, processed_at) "
                        "VALUES ('evt_elsewhere', 't', '{}', 'processed', $1, $1)", later)
    assert await pool.fetchval(STORE_EVENT, "evt_elsewhere", "processed") is False
    assert await owner.fetchval(f"SELECT count(*) FROM {EVENTS} WHERE event_id = 'evt_elsewhere'") == 1

    # Past the retention the legacy week leaves whole, archived; the later partition stays.
    assert await pool.fetchval("SELECT array_agg(p) FROM cuty_partitions_detach($1, $2, 1000) p",
                               EVENTS, legacy[1]) == [f"{EVENTS}_legacy"]
    job = payments_retention(pool)
    done = await Retention(pool, [t for t in job.tables if t.name == EVENTS], tmp_path).round()
    assert done.dropped == [f"{EVENTS}_legacy"]
    assert len((tmp_path / EVENTS / f"{EVENTS}_legacy.csv").read_text().splitlines()) == 1 + 4
    assert [r["event_id"] for r in await owner.fetch(f"SELECT event_id FROM {EVENTS}")] == ["evt_elsewhere"]
    assert [t.retention_days for t in job.tables if t.name == EVENTS] == [30]
