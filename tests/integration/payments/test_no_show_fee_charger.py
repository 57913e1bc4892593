"""The no-show fee's charger (payments/checkout/no_show_fee.py) against the real database, the real
payments core and the in-memory PSP: chargers racing for one fee charge it once (the lease, then
one key), a PSP that does not answer leaves it due for the worker, a purchase that saved no card
is declined without any PSP call, and a card declined off-session is declined with its reason."""
from __future__ import annotations

import asyncio
import uuid

import asyncpg

from payments.checkout.no_show_fee import NoShowFees, fee_key

PRICE, FEE = 10000, 2500


async def _no_show_with_fee(payments_dsn, core, *, save_card: bool = True) -> str:
    """A completed booking whose customer accepted FEE and paid (saving the card, or not), now
    marked no-show with its fee due."""
    cid, merchant = uuid.uuid4(), f"m-{uuid.uuid4().hex[:8]}"
    purchase = await core.create_and_charge(
        checkout_id=str(cid), amount_minor=PRICE, currency="TRY", payment_method="pm_card_ok",
        idempotency_key=str(uuid.uuid4()), customer_id="c1", merchant_id=merchant,
        off_session="setup" if save_card else None)
    assert purchase.status == "succeeded"
    conn = await asyncpg.connect(payments_dsn)
    try:
        await conn.execute(
            "INSERT INTO checkouts (id, customer_id, kind, state, slot_id, hold_id, amount_minor, currency, "
            "expire_time, merchant_id, payment_key, payment_id, start_time, no_show_fee_minor, "
            "no_show_fee_accepted_at, no_show_at, no_show_by, no_show_fee_status, no_show_fee_next_at) "
            "VALUES ($1, 'c1', 'booking', 'COMPLETED', gen_random_uuid(), $6, $2, 'TRY', now(), $3, "
            "gen_random_uuid(), $4, now() - interval '1 minute', $5, now(), now(), 'staff:s', 'due', now())",
            cid, PRICE, merchant, uuid.UUID(purchase.id), FEE, f"h-{cid}")
    finally:
        await conn.close()
    return str(cid)


async def _fee(payments_dsn, cid: str) -> asyncpg.Record:
    conn = await asyncpg.connect(payments_dsn)
    try:
        return await conn.fetchrow(
            "SELECT no_show_fee_status, no_show_fee_payment_id, no_show_fee_failure, no_show_fee_lease_owner, "
            "no_show_fee_next_at > now() AS later, "
            "(SELECT array_agg(type ORDER BY created_at) FROM merchant_events m WHERE m.checkout_id = c.id) AS events, "
            "(SELECT array_agg(to_status ORDER BY seq) FROM payment_events e "
            " WHERE e.checkout_id = c.id AND e.source = 'no_show_fee') AS timeline "
            "FROM checkouts c WHERE id = $1", uuid.UUID(cid))
    finally:
        await conn.close()


def _fees(payments_pool, core, **kw) -> NoShowFees:
    return NoShowFees(payments_pool, core, "test", **{"lease_seconds": 30, "retry_seconds": 0, "poll_seconds": 0.1,
                                                      **kw})


async def test_chargers_racing_for_one_fee_charge_it_once(payments_dsn, payments_pool, core, fake_psp):
    cid = await _no_show_with_fee(payments_dsn, core)
    create = fake_psp.create_intent

    async def slow_create(key, body):  # every charger is in flight at once
        await asyncio.sleep(0.2)
        return await create(key, body)

    fake_psp.create_intent = slow_create
    creates = fake_psp.calls["create"]
    fees = [_fees(payments_pool, core) for _ in range(8)]
    await asyncio.gather(*(f.charge(cid) for f in fees), *(f.run_once() for f in fees))
    row = await _fee(payments_dsn, cid)
    assert row["no_show_fee_status"] == "charged" and row["no_show_fee_lease_owner"] is None
    assert fake_psp.charges[fee_key(cid)] == 1
    assert fake_psp.calls["create"] - creates == 1  # one lease holder asked the PSP at all
    fee_payment = await core.get(str(row["no_show_fee_payment_id"]))
    assert (fee_payment.amount_minor, fee_payment.off_session, fee_payment.checkout_id) == (FEE, "charge", cid)
    assert list(row["events"]) == ["booking.no_show_fee_charged"] and list(row["timeline"]) == ["charged"]


async def test_a_psp_that_does_not_answer_leaves_the_fee_due_for_the_worker(payments_dsn, payments_pool, core,
                                                                               fake_psp):
    cid = await _no_show_with_fee(payments_dsn, core)
    fees = _fees(payments_pool, core, retry_seconds=60)
    fake_psp.unavailable["create"] = 1
    await fees.charge(cid)
    row = await _fee(payments_dsn, cid)
    # Unknown: still due, the lease given back, tried again later; the payment (created) is kept.
    assert (row["no_show_fee_status"], row["no_show_fee_lease_owner"], row["later"]) == ("due", None, True)
    assert fake_psp.charges[fee_key(cid)] == 0 and row["events"] is None
    assert await fees.run_once() == 0  # not due again yet
    conn = await asyncpg.connect(payments_dsn)
    try:
        await conn.execute("UPDATE checkouts SET no_show_fee_next_at = now() WHERE id = $1", uuid.UUID(cid))
    finally:
        await conn.close()
    assert await fees.run_once() >= 1
    row = await _fee(payments_dsn, cid)
    assert row["no_show_fee_status"] == "charged" and fake_psp.charges[fee_key(cid)] == 1


async def test_a_purchase_that_saved_no_card_is_declined_without_a_charge(payments_dsn, payments_pool, core, fake_psp):
    cid = await _no_show_with_fee(payments_dsn, core, save_card=False)
    creates = fake_psp.calls["create"]
    await _fees(payments_pool, core).charge(cid)
    row = await _fee(payments_dsn, cid)
    assert (row["no_show_fee_status"], row["no_show_fee_failure"], row["no_show_fee_payment_id"]) == (
        "declined", "no-saved-card", None)
    assert fake_psp.calls["create"] == creates and list(row["events"]) == ["booking.no_show_fee_declined"]


async def test_a_card_declined_off_session_is_declined_with_its_reason(payments_dsn, payments_pool, core, fake_psp):
    cid = await _no_show_with_fee(payments_dsn, core)
    fake_psp.declining_off_session = True
    fees = _fees(payments_pool, core)
    await fees.charge(cid)
    await fees.charge(cid)  # decided: not claimed again
    row = await _fee(payments_dsn, cid)
    assert (row["no_show_fee_status"], row["no_show_fee_failure"]) == ("declined", "card_declined")
    assert fake_psp.charges[fee_key(cid)] == 0 and fake_psp.calls["create"] == 2  # the purchase and one fee try
    assert (await core.get(str(row["no_show_fee_payment_id"]))).status == "failed"
