"""The saga's state lists have one source, payments/checkout/domain.py. Python's SQL builds its lists
from the domain's sets (checkout/repository.py in_list); the schema cannot import them, so its lists
(CHECKs, partial indexes, trigger conditions, function bodies) are read back from the migrated
database and compared with the domain. A second list of finished states that drifts from
domain.TERMINAL fails here, wherever it is written."""
from __future__ import annotations

import re
import uuid

import asyncpg

from payments.ops import queries as ops_queries
from payments.checkout import metrics
from payments.checkout import domain as d, repository as repo

# A list of quoted state names as PostgreSQL prints it (`ARRAY['A'::text, 'B'::text]`, `IN ('A', 'B')`)
# or as it is written in SQL text; a single comparison (`state <> 'A'`) is a list of one.
STATE_LIST = re.compile(r"'[A-Z][A-Z_]*'(?:::text)?(?:\s*,\s*'[A-Z][A-Z_]*'(?:::text)?)*")
NAME = re.compile(r"'([A-Z][A-Z_]*)'")
STATES = frozenset(d.STATES)

CHECKS = "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'checkouts'::regclass"
INDEXES = ("SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
           "WHERE indrelid = 'checkouts'::regclass")
TRIGGERS = "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal"
FUNCTIONS = """
SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
"""


def state_lists(text: str) -> list[frozenset[str]]:
    """Every list of saga states in `text` (lists naming anything else, such as a currency, are not)."""
    found = (frozenset(NAME.findall(m.group())) for m in STATE_LIST.finditer(text))
    return [s for s in found if s <= STATES]


async def schema_texts(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {f"{kind} {name}": text for kind, query in (("check", CHECKS), ("index", INDEXES),
                                                            ("trigger", TRIGGERS), ("function", FUNCTIONS))
                for name, text in await conn.fetch(query)}
    finally:
        await conn.close()


def python_texts() -> dict[str, str]:
    """The SQL constants of the modules that name saga states."""
    return {f"{module.__name__}.{name}": value for module in (repo, ops_queries, metrics)
            for name, value in vars(module).items() if isinstance(value, str) and name.isupper()}


async def test_the_schemas_state_lists_are_the_domains(payments_dsn):
    texts = await schema_texts(payments_dsn)

    def lists(name: str) -> set[frozenset[str]]:
        return set(state_lists(texts[name]))

    assert lists("check checkouts_state_check") == {STATES}
    assert lists("check checkouts_terminal_idle") == {d.TERMINAL}
    assert lists("check checkouts_attention_idle") == {d.IDLE - d.TERMINAL}
    assert lists("check checkouts_attention_from_check") == {d.ATTENTION_STATES}
    assert lists("check checkouts_outcome_check") == {d.RELEASE_OUTCOMES}
    assert lists("function sagas_live_keep") == {d.TERMINAL}
    # The wake-up: never a saga with nothing to do; in a reschedule's states any payment of the
    # checkout (its difference is a second payment), as domain.watched_payment_id routes on it.
    assert lists("function checkouts_wake_on_payment") == {d.IDLE, d.RESCHEDULE_PAYMENT_STATES}


async def test_no_second_list_of_finished_states_anywhere(payments_dsn):
    """A list sharing most of domain.TERMINAL is one of the domain's sets, in the schema and in the
    SQL of Python alike (a copy missing one state, or with one too many, is found)."""
    texts = {**await schema_texts(payments_dsn), **python_texts()}
    allowed = {d.TERMINAL, d.IDLE, STATES}
    looked_at = 0
    for where, text in texts.items():
        for states in state_lists(text):
            if len(states & d.TERMINAL) >= 4:
                looked_at += 1
                assert states in allowed, (where, sorted(states))
    assert looked_at >= 8  # the CHECKs, the index, the trigger, TRANSITION, CLAIM/RELEASE, ops STUCK
    assert metrics.NON_TERMINAL == d.NON_TERMINAL and set(d.NON_TERMINAL) == STATES - d.TERMINAL


async def test_the_payment_that_wakes_a_saga_is_the_one_its_step_routes_on(payments_dsn):
    """For every state: a status change of the payment domain.watched_payment_id names wakes the saga
    unless it is idle; another payment of the checkout wakes it only in a reschedule's states (where the
    trigger wakes on any); the checkout's payment_id stays the purchase's. All rolled back."""
    conn = await asyncpg.connect(payments_dsn)
    tr = conn.transaction()
    await tr.start()
    try:
        # The CHECKs tie each state to facts this does not ask about; only the state's own stays.
        for (name,) in await conn.fetch("SELECT conname FROM pg_constraint WHERE conrelid = 'checkouts'::regclass "
                                        "AND contype = 'c' AND conname <> 'checkouts_state_check'"):
            await conn.execute(f'ALTER TABLE checkouts DROP CONSTRAINT "{name}"')
        for state in d.STATES:
            checkout = uuid.uuid4()
            purchase, difference = uuid.uuid4(), uuid.uuid4()
            for payment in (purchase, difference):
                await conn.execute(
                    "INSERT INTO payments (id, checkout_id, status, amount_minor, currency, payment_method, "
                    "idempotency_key, merchant_id) VALUES ($1::uuid, $2, 'created', 100, 'TRY', 'pm_card_ok', $1::text, "
                    "'m-watched')", payment, checkout)
            row = await conn.fetchrow(
                "INSERT INTO checkouts (id, customer_id, kind, state, payment_key, payment_id, "
                "reschedule_payment_id) VALUES ($1, 'c-watched', 'booking', $2, gen_random_uuid(), $3, $4) "
                "RETURNING *, clock_timestamp() AS db_now", checkout, state, purchase, difference)
            watched = d.watched_payment_id(d.Saga.from_row(row))
            for payment in (purchase, difference):
                await conn.execute("SAVEPOINT change")
                await conn.execute("UPDATE payments SET status = 'processing', version = version + 1 WHERE id = $1", payment)
                after = await conn.fetchrow("SELECT next_run_at, payment_id FROM checkouts WHERE id = $1", checkout)
                await conn.execute("ROLLBACK TO SAVEPOINT change")
                woken = after["next_run_at"] is not None
                if str(payment) == watched:
                    assert woken == (state not in d.IDLE), (state, "watched")
                else:
                    assert woken == (state in d.RESCHEDULE_PAYMENT_STATES and state not in d.IDLE), (state, "other")
                assert after["payment_id"] == purchase, state
    finally:
        await tr.rollback()
        await conn.close()
