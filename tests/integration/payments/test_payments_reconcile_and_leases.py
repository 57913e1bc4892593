"""Reconciliation and leases against the real PostgreSQL (fake PSP): claims are exclusive across
replicas, a paused lease holder is taken over and its late write fenced by the version token."""
import asyncio

from cutylib.testing.ids import new_id
from cutylib.testing.procs import wait_for
from payments import metrics as m
from payments.reconcile import Reconciler
from cutylib.testing.trust import TEST_MERCHANT


async def charge(core, method="pm_card_no_webhook", key=None):
    return await core.create_and_charge(checkout_id=new_id(), amount_minor=990, currency="USD", payment_method=method,
                                        idempotency_key=key or new_id(), customer_id="c",
                                        merchant_id=TEST_MERCHANT)


async def events(pool, payment_id):
    return await pool.fetch("SELECT source, from_status, to_status, version, note FROM payment_events"
                            " WHERE payment_id = $1 ORDER BY seq", payment_id)


async def reconcile_until(reconciler, core, payment_id, status, timeout=10.0):
    async def done():
        await reconciler.run_once()
        return (await core.get(payment_id)).status == status
    await wait_for(done, timeout=timeout, message=f"{payment_id} reconciled to {status}")


async def test_processing_payment_without_webhook_is_reconciled(make_core, fake_psp, payments_pool):
    core = make_core(reconcile_after_seconds=0.0)
    p = await charge(core)
    assert p.status == "processing"
    reconciler = Reconciler(core)
    await reconciler.run_once()
    assert (await core.get(p.id)).status == "processing"  # the PSP says processing too: nothing to do
    fake_psp.set_status(p.psp_intent_id, "succeeded")
    await reconcile_until(reconciler, core, p.id, "succeeded")
    evs = await events(payments_pool, p.id)
    assert [(e["source"], e["to_status"]) for e in evs][-1] == ("reconcile", "succeeded")
    # reconciled once; the counter may also count other tests' payments in the shared database,
    # which a reconciler with no delay finds due too
    assert [e["source"] for e in evs].count("reconcile") == 1
    assert core.metrics.value(m.RECONCILED_PAYMENTS) >= 1
    row = await payments_pool.fetchrow("SELECT lease_owner, reconcile_at FROM payments WHERE id = $1", p.id)
    assert (row["lease_owner"], row["reconcile_at"]) == (None, None)  # released, and off the queue


async def test_create_that_timed_out_is_replayed_with_the_same_key_and_charged_once(make_core, fake_psp):
    core = make_core(reconcile_after_seconds=0.0)
    key = new_id()
    fake_psp.unavailable["create"] = 1
    p = await charge(core, method="pm_card_ok", key=key)
    assert p.status == "created"
    await reconcile_until(Reconciler(core), core, p.id, "succeeded")
    assert fake_psp.charges[key] == 1
    assert (await core.get(p.id)).psp_intent_id


async def test_replicas_reconcile_each_payment_exactly_once(make_core, fake_psp, payments_pool):
    creator = make_core(reconcile_after_seconds=0.0)
    payments = [await charge(creator) for _ in range(20)]
    for p in payments:
        fake_psp.set_status(p.psp_intent_id, "succeeded")
    replicas = [make_core(reconcile_after_seconds=0.0) for _ in range(3)]
    recs = [Reconciler(r) for r in replicas]

    async def all_done():
        await asyncio.gather(*(r.run_once() for r in recs))
        views = await asyncio.gather(*(creator.get(p.id) for p in payments))
        return all(v.status == "succeeded" for v in views)
    await wait_for(all_done, timeout=15, message="all reconciled")
    for p in payments:
        assert [e["to_status"] for e in await events(payments_pool, p.id)] == ["created", "processing", "succeeded"]
    assert sum(r.metrics.value(m.RECONCILED_PAYMENTS) for r in replicas) == 20
    assert sum(r.metrics.value(m.VERSION_CONFLICTS) for r in replicas) == 0  # SKIP LOCKED + lease: no overlap


async def test_paused_lease_holder_is_taken_over_and_its_late_write_fenced(make_core, fake_psp, payments_pool):
    paused = make_core(lease_seconds=0.3, test_pause_after_lease_ms=1500)
    other = make_core(lease_seconds=0.3)
    p = await charge(paused)
    intent = fake_psp.set_status(p.psp_intent_id, "succeeded")
    slow = asyncio.create_task(paused.finalize_leased(p.id, "succeeded", "webhook", intent=intent, note="paused"))
    await wait_for(lambda: _owner_is(payments_pool, p.id, paused.worker_id), message="paused worker holds the lease")

    async def other_finishes():  # refused (deferred) until the paused worker's lease expires
        return await other.finalize_leased(p.id, "succeeded", "webhook", intent=intent, note="takeover")
    done = await wait_for(other_finishes, timeout=5, interval=0.05, message="takeover after lease expiry")
    assert (done.status, done.version) == ("succeeded", 3)
    assert other.metrics.value(m.LEASE_TAKEOVERS) == 1 and other.metrics.value(m.DEFERRED_FINALIZES) >= 1

    late = await slow  # wakes up, writes with its old version: zero rows, re-reads, sees it is done
    assert (late.status, late.version) == ("succeeded", 3)
    assert paused.metrics.value(m.VERSION_CONFLICTS) == 1
    evs = await events(payments_pool, p.id)
    assert [(e["to_status"], e["note"]) for e in evs][2:] == [("succeeded", "takeover")]


async def _owner_is(pool, payment_id, owner):
    return await pool.fetchval("SELECT lease_owner FROM payments WHERE id = $1", payment_id) == owner
