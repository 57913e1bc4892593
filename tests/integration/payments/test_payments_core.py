"""The payments core against the real PostgreSQL: create/charge, finalize, cancel, refund, timeline."""
import asyncio
import uuid

import asyncpg
import pytest

from cutylib.errors import FailedPrecondition, InvalidArgument, NotFound
from cutylib.testing.ids import new_id
from cutylib.testing.trust import TEST_MERCHANT


async def charge(core, method="pm_card_ok", **kw):
    args = dict(checkout_id=new_id(), amount_minor=1500, currency="TRY", payment_method=method,
                idempotency_key=new_id(), customer_id="cust-1", merchant_id=TEST_MERCHANT)
    args.update(kw)
    return await core.create_and_charge(**args)


async def test_ok_charge_succeeds_without_secret_and_logs_timeline(core):
    p = await charge(core)
    assert (p.status, p.version, p.redirect_url, p.client_secret) == ("succeeded", 2, None, None)
    assert p.psp_intent_id.startswith("pi_")
    events = await core.timeline(p.id)
    assert [(e.source, e.from_status, e.to_status, e.version) for e in events] == [
        ("sync", None, "created", 1), ("sync", "created", "succeeded", 2)]


async def test_same_key_returns_first_answer_without_second_psp_call(core, fake_psp):
    key = new_id()
    first = await charge(core, idempotency_key=key, checkout_id=None)
    calls = fake_psp.calls["create"]
    again = await charge(core, idempotency_key=key, checkout_id=None)
    assert (again.id, again.version) == (first.id, first.version)
    assert fake_psp.calls["create"] == calls and fake_psp.charges[key] == 1


async def test_concurrent_creates_with_one_key_make_one_payment(core, fake_psp, payments_pool):
    key, checkout = new_id(), new_id()
    views = await asyncio.gather(*(charge(core, idempotency_key=key, checkout_id=checkout) for _ in range(10)))
    assert len({v.id for v in views}) == 1
    assert await payments_pool.fetchval("SELECT count(*) FROM payments WHERE idempotency_key = $1", key) == 1
    assert fake_psp.charges[key] == 1
    assert await payments_pool.fetchval(
        "SELECT count(*) FROM payment_events WHERE payment_id = $1 AND to_status = 'succeeded'", views[0].id) == 1


async def test_same_key_other_body_is_refused(core):
    key = new_id()
    await charge(core, idempotency_key=key)
    with pytest.raises(FailedPrecondition) as e:
        await charge(core, idempotency_key=key, amount_minor=1)
    assert e.value.reason == "idempotency-key-reused"


@pytest.mark.parametrize("kw, field", [
    ({"amount_minor": 0}, "amount.amount_minor"),
    ({"amount_minor": -5}, "amount.amount_minor"),
    ({"currency": "TL"}, "amount.currency_code"),
    ({"currency": "T1Y"}, "amount.currency_code"),
    ({"payment_method": ""}, "payment_method"),
    ({"idempotency_key": ""}, "idempotency_key"),
    ({"checkout_id": "not-a-uuid"}, "checkout_id"),
])
async def test_bad_create_arguments_name_the_field(core, kw, field):
    with pytest.raises(InvalidArgument) as e:
        await charge(core, **kw)
    assert e.value.field == field


async def test_psp_refusing_the_create_fails_the_payment(core):
    p = await charge(core, method="pm_card_unknown")
    assert (p.status, p.failure_reason) == ("failed", "payment_method_unknown")


async def test_psp_unavailable_leaves_payment_created_never_failed(core, fake_psp):
    fake_psp.unavailable["create"] = 1
    p = await charge(core)
    assert (p.status, p.psp_intent_id) == ("created", None)


async def test_3ds_view_has_action_and_it_vanishes_once_terminal(core, fake_psp):
    p = await charge(core, method="pm_card_3ds")
    assert p.status == "requires_action" and p.redirect_url and p.client_secret
    done = await core.finalize(p.id, "succeeded", "webhook", intent=fake_psp.set_status(p.psp_intent_id, "succeeded"))
    assert (done.status, done.redirect_url, done.client_secret) == ("succeeded", None, None)
    proto = done.to_proto()
    assert not proto.HasField("next_action") and proto.client_secret == ""


async def test_cancel(core):
    p = await charge(core, method="pm_card_3ds")
    c = await core.cancel(p.id)
    assert (c.status, c.client_secret, c.redirect_url) == ("canceled", None, None)
    assert (await core.cancel(p.id)).version == c.version  # already terminal: nothing more


async def test_cancel_of_a_payment_that_succeeded_at_the_psp_reports_success(core, fake_psp):
    p = await charge(core, method="pm_card_no_webhook")
    fake_psp.set_status(p.psp_intent_id, "succeeded")  # we have not heard yet
    c = await core.cancel(p.id)
    assert c.status == "succeeded"


async def test_refund_is_idempotent_and_only_for_succeeded(core, fake_psp):
    p = await charge(core)
    key = new_id()
    r = await core.refund(p.id, key)
    assert r.status == "refunded"
    assert (await core.refund(p.id, key)).version == r.version
    assert len(fake_psp.refunds) == 1
    failed = await charge(core, method="pm_card_declined")
    with pytest.raises(FailedPrecondition):
        await core.refund(failed.id, new_id())


async def test_a_status_change_wakes_its_checkout_in_the_same_statement(make_core, payments_pool):
    """Issue 11: the checkout saga's wake-up is the database's (trigger payments_wake_checkout,
    payments_wake_checkout): it commits with the payment change or not at all, and finalize knows nothing of it."""
    core = make_core()
    checkout = uuid.uuid4()
    await payments_pool.execute(
        "INSERT INTO checkouts (id, customer_id, kind, slot_id, state, version, hold_id, amount_minor, currency, "
        "expire_time, payment_key, merchant_id) VALUES ($1, 'c-1', 'booking', $2, 'AWAITING_ACTION', 3, 'h-1', 2500, "
        "'TRY', clock_timestamp() + interval '5 minutes', $3, $4)", checkout, uuid.uuid4(), uuid.uuid4(), TEST_MERCHANT)
    p = await core.create_and_charge(checkout_id=str(checkout), amount_minor=2500, currency="TRY",
                                     payment_method="pm_card_3ds", idempotency_key=new_id(), customer_id="c-1",
                                     merchant_id=TEST_MERCHANT)
    woken = await payments_pool.fetchrow("SELECT payment_id, next_run_at FROM checkouts WHERE id = $1", checkout)
    assert woken["payment_id"] == uuid.UUID(p.id) and woken["next_run_at"] is not None

    await payments_pool.execute("UPDATE checkouts SET next_run_at = NULL WHERE id = $1", checkout)
    async with payments_pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("UPDATE payments SET status = 'processing', version = version + 1, redirect_url = NULL, "
                           "client_secret = NULL WHERE id = $1",
                           uuid.UUID(p.id))
        assert await conn.fetchval("SELECT next_run_at FROM checkouts WHERE id = $1", checkout) is not None
        await tx.rollback()
    # Rolled back with the payment change; a lease or an intent id learned is no wake-up either.
    assert await payments_pool.fetchval("SELECT next_run_at FROM checkouts WHERE id = $1", checkout) is None
    assert await core.take_lease(p.id)
    await core.release_lease(p.id)
    assert await payments_pool.fetchval("SELECT next_run_at FROM checkouts WHERE id = $1", checkout) is None



async def test_database_refuses_regressions_secrets_on_terminal_and_event_edits(core, payments_pool):
    p = await charge(core)
    with pytest.raises(asyncpg.CheckViolationError, match="may not move"):
        await payments_pool.execute("UPDATE payments SET status = 'processing', version = version + 1 WHERE id = $1",
                                    uuid.UUID(p.id))
    with pytest.raises(asyncpg.CheckViolationError, match="without a version bump"):
        await payments_pool.execute("UPDATE payments SET status = 'refunded' WHERE id = $1", uuid.UUID(p.id))
    with pytest.raises(asyncpg.CheckViolationError, match="action_only_while_waiting"):
        await payments_pool.execute("UPDATE payments SET client_secret = 'pi_secret' WHERE id = $1", uuid.UUID(p.id))
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await payments_pool.execute("UPDATE payment_events SET note = 'x' WHERE payment_id = $1", uuid.UUID(p.id))


async def test_stale_observation_changes_nothing(core):
    p = await charge(core)
    late = await core.finalize(p.id, "processing", "webhook")
    assert (late.status, late.version) == ("succeeded", p.version)


async def test_timeline_has_the_payment_and_its_checkout_saga_events(core, payments_pool):
    checkout = new_id()
    p = await charge(core, checkout_id=checkout)
    other_attempt = await charge(core, checkout_id=checkout, method="pm_card_declined")
    async with payments_pool.acquire() as conn:
        # A saga transition of the checkout that names no payment attempt (as the saga writes them).
        await conn.execute("INSERT INTO payment_events (checkout_id, source, from_status, to_status, version, note, "
                           "merchant_id) VALUES ($1, 'saga', 'HELD', 'CHARGING', 3, 'pay', $2)",
                           uuid.UUID(checkout), p.merchant_id)
    events = await core.timeline(p.id)
    assert [(e.source, e.to_status) for e in events] == [
        ("sync", "created"), ("sync", "succeeded"), ("saga", "CHARGING")]
    assert all(e.payment_id in (p.id, None) for e in events)
    assert other_attempt.id not in {e.payment_id for e in events}
    with pytest.raises(NotFound):
        await core.timeline(new_id())
