"""Issue 14: checkouts, payments and their events made before merchants existed move into the
default merchant; a checkout that never held anything keeps none (it belongs to no merchant)."""
from __future__ import annotations

import shutil
import uuid

import asyncpg
import pytest

from cutylib.db import migrate
from cutylib.tenancy import DEFAULT_MERCHANT
from cutylib.testing.procs import REPO

MIGRATIONS = REPO / "services" / "payments" / "migrations"
TENANCY = "0120_merchants"


async def test_rows_from_before_merchants_move_into_the_default_merchant(scratch_db, tmp_path):
    for f in sorted(MIGRATIONS.glob("*.sql")):
        if f.stem < TENANCY:
            shutil.copy(f, tmp_path / f.name)
    await migrate(scratch_db, tmp_path)
    held, pending, payment = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    conn = await asyncpg.connect(scratch_db)
    try:
        await conn.execute(
            "INSERT INTO checkouts (id, customer_id, kind, slot_id, state, hold_id, amount_minor, currency, expire_time) "
            "VALUES ($1, 'c-1', 'booking', gen_random_uuid(), 'HELD', 'h-1', 100, 'TRY', now() + interval '5 minutes'), "
            "       ($2, 'c-1', 'booking', gen_random_uuid(), 'PENDING', NULL, NULL, NULL, NULL)", held, pending)
        await conn.execute("INSERT INTO payments (id, checkout_id, amount_minor, currency, payment_method, idempotency_key) "
                           "VALUES ($1, $2, 100, 'TRY', 'pm_card_ok', 'key-1')", payment, held)
        await conn.execute("INSERT INTO payment_events (payment_id, checkout_id, source, to_status) "
                           "VALUES ($1, $2, 'sync', 'created'), (NULL, $3, 'saga', 'PENDING')", payment, held, pending)
    finally:
        await conn.close()

    assert TENANCY in await migrate(scratch_db, MIGRATIONS)

    conn = await asyncpg.connect(scratch_db)
    try:
        merchant = {r["id"]: r["merchant_id"] for r in await conn.fetch("SELECT id, merchant_id FROM checkouts")}
        assert merchant == {held: DEFAULT_MERCHANT, pending: None}
        assert await conn.fetchval("SELECT merchant_id FROM payments WHERE id = $1", payment) == DEFAULT_MERCHANT
        events = {r["checkout_id"]: r["merchant_id"] for r in await conn.fetch("SELECT checkout_id, merchant_id FROM payment_events")}
        assert events == {held: DEFAULT_MERCHANT, pending: None}
        # the attempt id is unique within its merchant now, so two merchants may not collide
        await conn.execute("INSERT INTO payments (id, checkout_id, amount_minor, currency, payment_method, "
                           "idempotency_key, merchant_id) VALUES (gen_random_uuid(), NULL, 1, 'TRY', 'pm', 'key-1', 'm-2')")
        with pytest.raises(asyncpg.UniqueViolationError):  # ... but one merchant has each attempt id once
            await conn.execute("INSERT INTO payments (id, amount_minor, currency, payment_method, idempotency_key, "
                               "merchant_id) VALUES (gen_random_uuid(), 1, 'TRY', 'pm', 'key-1', 'm-2')")
    finally:
        await conn.close()
