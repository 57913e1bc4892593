"""The payments schema as migrated (services/payments/migrations): one file per function, the
state machines of its triggers the same as the domain's tables, the merchant of payments and
their events."""
from __future__ import annotations

import collections
import datetime as dt
import itertools
import re
import shutil
import uuid

import asyncpg
import pytest

from cutylib.db import SHARED_MIGRATIONS, migrate
from cutylib.testing.procs import REPO
from payments import domain as payment_domain
from payments.checkout import domain as saga_domain
from payments.checkout.repository import CLAIM_DUE
from payments.repository import CLAIM_RECONCILE

MIGRATIONS = REPO / "services" / "payments" / "migrations"
FUNCTION_FOLDERS = (SHARED_MIGRATIONS / "functions", MIGRATIONS / "functions")

# The functions of the public schema, but for those an extension owns.
SCHEMA_FUNCTIONS = """
SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public'
  AND NOT EXISTS (SELECT 1 FROM pg_depend d
                  WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
"""


async def test_every_function_has_one_file_and_every_file_is_a_function(payments_dsn):
    conn = await asyncpg.connect(payments_dsn)
    try:
        in_database = collections.Counter(r["proname"] for r in await conn.fetch(SCHEMA_FUNCTIONS))
    finally:
        await conn.close()
    files = [f for folder in FUNCTION_FOLDERS for f in sorted(folder.glob("*.sql"))]
    assert in_database == collections.Counter(f.stem for f in files)
    for f in files:
        # Only the function itself, named like its file: the body and the comments aside, one statement.
        text = re.sub(r"--[^\n]*", "", re.sub(r"\$(\w*)\$.*?\$\1\$", "$$", f.read_text(), flags=re.S))
        statements = [s.strip() for s in text.split(";") if s.strip()]
        assert len(statements) == 1, f.name
        assert re.match(rf"CREATE OR REPLACE FUNCTION {f.stem}\(", statements[0]), f.name


async def allowed_moves(dsn: str, table: str, column: str, states, keep: set[str], insert) -> set[tuple[str, str]]:
    """Every move of `table`.`column` from one of `states` to another, tried against the table's
    triggers: the moves they let through. The table's other CHECKs tie a state to facts (a hold, a
    price, a refund) that are not what this asks, so they are dropped for the try; `keep` names the
    CHECKs that stay (the state's own). All of it is rolled back."""
    allowed: set[tuple[str, str]] = set()
    conn = await asyncpg.connect(dsn)
    tr = conn.transaction()
    await tr.start()
    try:
        for (name,) in await conn.fetch("SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass "
                                        "AND contype = 'c' AND NOT conname = ANY ($2::text[])", table, sorted(keep)):
            await conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for old, new in itertools.permutations(states, 2):
            await conn.execute("SAVEPOINT move")
            try:
                row_id = await insert(conn, old, new)
            except asyncpg.CheckViolationError:
                await conn.execute("ROLLBACK TO SAVEPOINT move")
                continue  # no such row may exist (a state's own CHECK)
            try:
                await conn.execute(f"UPDATE {table} SET {column} = $2, version = version + 1 WHERE id = $1",
                                   row_id, new)
                allowed.add((old, new))
            except asyncpg.CheckViolationError as e:
                assert f"may not move from {old} to {new}" in str(e)
            await conn.execute("ROLLBACK TO SAVEPOINT move")
    finally:
        await tr.rollback()
        await conn.close()
    return allowed


def moves(transitions: dict[str, frozenset[str]]) -> set[tuple[str, str]]:
    return {(old, new) for old, targets in transitions.items() for new in targets}


async def test_the_saga_trigger_allows_exactly_the_domains_transitions(scratch_db):
    await migrate(scratch_db, MIGRATIONS)

    async def checkout(conn, state, to):
        # A saga needing attention goes back only to the state it left (attention_from, whose CHECK
        # says which states may be left for an operator).
        return await conn.fetchval(
            "INSERT INTO checkouts (id, customer_id, kind, state, attention_from) "
            "VALUES (gen_random_uuid(), 'c-moves', 'booking', $1, $2) RETURNING id",
            state, to if state == saga_domain.NEEDS_ATTENTION else None)

    allowed = await allowed_moves(scratch_db, "checkouts", "state", list(saga_domain.TRANSITIONS),
                                  {"checkouts_state_check", "checkouts_attention_from_check"}, checkout)
    # The one-call start and the completion from CHARGING need facts besides the state (below); a
    # bare state change is refused.
    assert allowed == moves(saga_domain.TRANSITIONS) - {saga_domain.ONE_CALL_START,
                                                        saga_domain.CAPTURED_COMPLETION}


@pytest.mark.parametrize("payment,allowed", [
    ("succeeded", True),
    ("partially_refunded", True),     # still captured
    ("processing", False),            # not captured yet
    ("failed", False),
    ("canceled", False),
    (None, False),                    # no payment on the row
    ("another checkout's", False),    # a captured payment, but not this checkout's
])
async def test_a_checkout_completes_from_charging_only_with_its_payment_captured(scratch_db, payment, allowed):
    """CHARGING -> COMPLETED is the synchronous capture recorded with the confirm; the trigger lets it
    through only when the row names a payment of this checkout that the payments table says is
    captured."""
    await migrate(scratch_db, MIGRATIONS)
    conn = await asyncpg.connect(scratch_db)
    try:
        cid = await conn.fetchval(
            "INSERT INTO checkouts (id, customer_id, kind, state, slot_id, hold_id, amount_minor, currency, "
            "expire_time, merchant_id, payment_method, payment_key) "
            "VALUES (gen_random_uuid(), 'c-cap', 'booking', 'CHARGING', gen_random_uuid(), 'h', 1000, 'TRY', "
            "now() + interval '10 minutes', 'm-cap', 'pm_card_ok', gen_random_uuid()) RETURNING id")
        pid = None
        if payment is not None:
            status = "succeeded" if payment == "another checkout's" else payment
            owner = uuid.uuid4() if payment == "another checkout's" else cid
            pid = await conn.fetchval(
                "INSERT INTO payments (id, checkout_id, merchant_id, customer_id, amount_minor, currency, "
                "payment_method, idempotency_key, status, refunded_minor, refund_settled_minor) "
                "VALUES (gen_random_uuid(), $1, 'm-cap', 'c-cap', 1000, 'TRY', 'pm_card_ok', $2, $3, $4, $4) RETURNING id",
                owner, str(uuid.uuid4()), status, 100 if status == "partially_refunded" else 0)
        move = conn.execute("UPDATE checkouts SET state = 'COMPLETED', version = version + 1, payment_id = $2, "
                            "next_run_at = NULL, lease_owner = NULL, lease_until = NULL WHERE id = $1", cid, pid)
        if allowed:
            await move
            assert await conn.fetchval("SELECT state FROM checkouts WHERE id = $1", cid) == "COMPLETED"
        else:
            with pytest.raises(asyncpg.CheckViolationError):
                await move
    finally:
        await conn.close()


@pytest.mark.parametrize("facts,allowed", [
    ({}, True),
    ({"payment_method": None}, False),         # a two-call checkout is held first, then paid
    ({"settle": "venue", "created_by": "staff-1", "venue_status": "unpaid"}, False),  # a staff-made one keeps
                                                                                      # its HELD (its merchant event)
    ({"payment_key": None}, False),            # never without the payment attempt ...
    ({"amount_minor": None}, False),           # ... nor without the hold
])
async def test_a_one_call_checkout_moves_from_pending_to_charging_only_with_its_hold_and_payment(
        scratch_db, facts, allowed):
    """PENDING -> CHARGING is a customer's one-call checkout recording its hold with its payment's
    start; the trigger lets it through only with both written and for that kind of checkout."""
    await migrate(scratch_db, MIGRATIONS)
    conn = await asyncpg.connect(scratch_db)
    try:
        cid = await conn.fetchval(
            "INSERT INTO checkouts (id, customer_id, kind, slot_id, payment_method, settle, created_by, venue_status) "
            "VALUES (gen_random_uuid(), 'c-one', 'booking', gen_random_uuid(), $1, $2, $3, $4) RETURNING id",
            facts.get("payment_method", "pm_card_ok"), facts.get("settle"), facts.get("created_by"),
            facts.get("venue_status"))
        move = conn.execute(
            "UPDATE checkouts SET state = 'CHARGING', version = version + 1, hold_id = gen_random_uuid(), "
            "amount_minor = $2, currency = 'TRY', expire_time = now() + interval '10 minutes', merchant_id = 'm-one', "
            "payment_key = $3 WHERE id = $1",
            cid, facts.get("amount_minor", 1000), facts.get("payment_key", uuid.uuid4()))
        if allowed:
            await move
            assert await conn.fetchval("SELECT state FROM checkouts WHERE id = $1", cid) == "CHARGING"
        else:
            with pytest.raises(asyncpg.CheckViolationError):
                await move
    finally:
        await conn.close()


async def test_the_payment_trigger_allows_exactly_the_domains_transitions(scratch_db):
    await migrate(scratch_db, MIGRATIONS)

    async def payment(conn, status, _to):
        return await conn.fetchval(
            "INSERT INTO payments (id, status, amount_minor, currency, payment_method, idempotency_key, merchant_id) "
            "VALUES (gen_random_uuid(), $1, 100, 'TRY', 'pm_card_ok', gen_random_uuid()::text, 'm-moves') "
            "RETURNING id", status)

    assert set(payment_domain.TRANSITIONS) == set(payment_domain.STATUSES)
    allowed = await allowed_moves(scratch_db, "payments", "status", payment_domain.STATUSES,
                                  {"payments_status_check"}, payment)
    assert allowed == moves(payment_domain.TRANSITIONS)


# A list of quoted payment statuses, as PostgreSQL prints it or as SQL text writes it.
STATUS_LIST = re.compile(r"'[a-z_]+'(?:::text)?(?:\s*,\s*'[a-z_]+'(?:::text)?)+")


def status_lists(text: str) -> list[frozenset[str]]:
    """Every list of two or more payment statuses in `text`."""
    found = (frozenset(re.findall(r"'([a-z_]+)'", m.group())) for m in STATUS_LIST.finditer(text))
    return [s for s in found if s <= set(payment_domain.STATUSES)]


async def test_a_payment_has_its_live_row_exactly_while_it_is_not_final(scratch_db):
    """The live payments (payments_live, kept by trigger) are domain.NON_TERMINAL, whatever the
    status a payment is written with or moves to; the triggers' and the reconciler's lists of them
    are the domain's. All rolled back."""
    await migrate(scratch_db, MIGRATIONS)
    live = set(payment_domain.NON_TERMINAL)
    conn = await asyncpg.connect(scratch_db)
    tr = conn.transaction()
    await tr.start()
    try:
        lists = [x for (text,) in await conn.fetch(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname LIKE 'payments_live_%'")
            for x in status_lists(text)]
        lists += status_lists(await conn.fetchval("SELECT prosrc FROM pg_proc WHERE proname = 'payments_live_keep'"))
        lists += status_lists(CLAIM_RECONCILE)
        assert len(lists) >= 6 and set(lists) == {frozenset(live)}, lists
        # A status's own CHECKs stay; the others tie a status to facts (a refund, a secret) not asked here.
        for (name,) in await conn.fetch("SELECT conname FROM pg_constraint WHERE conrelid = 'payments'::regclass "
                                        "AND contype = 'c' AND conname <> 'payments_status_check'"):
            await conn.execute(f'ALTER TABLE payments DROP CONSTRAINT "{name}"')

        async def live_status(payment_id):
            return await conn.fetchval("SELECT status FROM payments_live WHERE payment_id = $1", payment_id)
        for old in payment_domain.STATUSES:
            for new in sorted(payment_domain.TRANSITIONS[old]) or [None]:
                await conn.execute("SAVEPOINT move")
                payment_id = await conn.fetchval(
                    "INSERT INTO payments (id, status, amount_minor, currency, payment_method, idempotency_key, "
                    "merchant_id) VALUES (gen_random_uuid(), $1, 100, 'TRY', 'pm_card_ok', gen_random_uuid()::text, "
                    "'m-live') RETURNING id", old)
                assert await live_status(payment_id) == (old if old in live else None), old
                if new is not None:
                    await conn.execute("UPDATE payments SET status = $2, version = version + 1 WHERE id = $1",
                                       payment_id, new)
                    assert await live_status(payment_id) == (new if new in live else None), (old, new)
                await conn.execute("DELETE FROM payments WHERE id = $1", payment_id)
                assert await live_status(payment_id) is None, (old, new, "deleted")
                await conn.execute("ROLLBACK TO SAVEPOINT move")
    finally:
        await tr.rollback()
        await conn.close()


async def test_payments_and_their_events_carry_their_merchant(payments_dsn):
    """A payment's attempt id is unique within its merchant; an event names its merchant (nothing
    fills one in), and only the saga's event of a checkout that never held anything has none."""
    key, one, other = uuid.uuid4().hex, "m-" + uuid.uuid4().hex[:8], "m-" + uuid.uuid4().hex[:8]
    pending, payment = uuid.uuid4(), uuid.uuid4()
    conn = await asyncpg.connect(payments_dsn)
    try:
        insert = ("INSERT INTO payments (id, amount_minor, currency, payment_method, idempotency_key, merchant_id) "
                  "VALUES ($1, 100, 'TRY', 'pm_card_ok', $2, $3)")
        await conn.execute(insert, payment, key, one)
        await conn.execute(insert, uuid.uuid4(), key, other)  # two merchants may not collide ...
        with pytest.raises(asyncpg.UniqueViolationError):  # ... but one merchant has each attempt id once
            await conn.execute(insert, uuid.uuid4(), key, one)
        await conn.execute("INSERT INTO checkouts (id, customer_id, kind, slot_id) "
                           "VALUES ($1, 'c-merchant', 'booking', gen_random_uuid())", pending)
        for source, payment_id in (("sync", payment), ("saga", payment), ("claim", None)):
            with pytest.raises(asyncpg.CheckViolationError, match="payment_events_merchant_required"):
                await conn.execute("INSERT INTO payment_events (payment_id, checkout_id, source, to_status) "
                                   "VALUES ($1, $2, $3, 'x')", payment_id, pending, source)
        await conn.execute("INSERT INTO payment_events (payment_id, checkout_id, source, to_status, merchant_id) "
                           "VALUES ($1, NULL, 'sync', 'created', $3), (NULL, $2, 'saga', 'PENDING', NULL)",
                           payment, pending, one)
        events = await conn.fetch("SELECT payment_id, merchant_id FROM payment_events "
                                  "WHERE payment_id = $1 OR checkout_id = $2", payment, pending)
        assert {r["payment_id"]: r["merchant_id"] for r in events} == {payment: one, None: None}
        with pytest.raises(asyncpg.CheckViolationError, match="checkouts_held_has_merchant"):
            await conn.execute("UPDATE checkouts SET state = 'HELD', version = version + 1, hold_id = 'h-1', "
                               "amount_minor = 100, currency = 'TRY', expire_time = now() WHERE id = $1", pending)
    finally:
        await conn.close()


async def test_the_upgrade_to_the_live_rows_carries_each_live_saga_and_payment_and_no_finished_one(
        scratch_db, tmp_path):
    """Migrations 0330 and 0331 on a database with checkouts and payments: every saga not finished,
    or with a next run, gets its live row (state, time, next run), and every payment not final its
    own; no finished one does, and the workers' claim finds the due saga through its row."""
    before = tmp_path / "before"
    shutil.copytree(MIGRATIONS, before)
    for name in ("0330_sagas_live.sql", "0331_payments_live.sql", "functions/sagas_live_keep.sql",
                 "functions/payments_live_keep.sql"):
        (before / name).unlink()
    await migrate(scratch_db, before)
    conn = await asyncpg.connect(scratch_db)
    try:
        ids = {}
        for name, state, next_run in (("due", "PENDING", dt.timedelta(minutes=-1)),
                                      ("later", "PENDING", dt.timedelta(hours=1)),
                                      ("waiting", "PENDING", None), ("finished", "REJECTED", None)):
            ids[name] = await conn.fetchval(
                "INSERT INTO checkouts (id, customer_id, kind, state, product_id, quantity, order_id, amount_minor, "
                "currency, expire_time, next_run_at, merchant_id) "
                "VALUES (gen_random_uuid(), 'c-upgrade', 'codes', $1, gen_random_uuid(), 1, gen_random_uuid(), 2500, "
                "'TRY', now() + interval '1 hour', clock_timestamp() + $2, 'merchant-upgrade') RETURNING id",
                state, next_run)
        pays = {status: await conn.fetchval(
            "INSERT INTO payments (id, customer_id, status, version, amount_minor, currency, payment_method, "
            "idempotency_key, reconcile_at, merchant_id) VALUES (gen_random_uuid(), 'c-upgrade', $1, 1, 2500, 'TRY', "
            "'pm_card_ok', gen_random_uuid()::text, CASE WHEN $1 = 'processing' THEN now() END, 'merchant-upgrade') "
            "RETURNING id", status) for status in ("processing", "succeeded")}
        await migrate(scratch_db, MIGRATIONS)
        assert [tuple(r) for r in await conn.fetch("SELECT payment_id, status FROM payments_live")] == [
            (pays["processing"], "processing")]
        live = {r["checkout_id"]: r for r in await conn.fetch("SELECT * FROM sagas_live")}
        assert set(live) == {ids["due"], ids["later"], ids["waiting"]}
        for name in ("due", "later", "waiting"):
            row = await conn.fetchrow("SELECT state, updated_at, next_run_at FROM checkouts WHERE id = $1", ids[name])
            assert dict(row) == {k: live[ids[name]][k] for k in ("state", "updated_at", "next_run_at")}
        async with conn.transaction():
            claimed = await conn.fetch(CLAIM_DUE, "upgrade", 10, 30.0)
            assert [r["id"] for r in claimed] == [ids["due"]]
            # the claim moved its next run: the live row with it, in the same statement
            assert await conn.fetchval("SELECT next_run_at FROM sagas_live WHERE checkout_id = $1",
                                       ids["due"]) == claimed[0]["next_run_at"]
    finally:
        await conn.close()
