"""What the database itself guarantees about sagas: the transition table, fencing, SKIP LOCKED
claims, and wake-ups that cannot be lost."""
from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from cutylib.testing.procs import wait_for
from payments.checkout import domain as d, repository as repo
from payments.checkout.domain import validate_create


async def held(h, customer="c-db") -> d.Saga:
    c = await h.service.create(customer, validate_create(h.booking.add_slot(), "", 0), "")
    return await repo.Sagas(h.pool).get(c.id)


async def test_the_database_refuses_an_illegal_transition(harness):
    s = await held(harness)
    with pytest.raises(asyncpg.CheckViolationError, match="may not move from HELD to COMPLETED"):
        await harness.pool.execute("UPDATE checkouts SET state = 'COMPLETED', version = version + 1 WHERE id = $1",
                                   uuid.UUID(s.id))
    with pytest.raises(asyncpg.CheckViolationError, match="without a version bump"):
        await harness.pool.execute("UPDATE checkouts SET state = 'CHARGING' WHERE id = $1", uuid.UUID(s.id))
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await harness.pool.execute("DELETE FROM checkouts WHERE id = $1", uuid.UUID(s.id))
    assert (await repo.Sagas(harness.pool).get(s.id)).state == "HELD"


async def test_a_stale_or_displaced_worker_is_fenced(harness):
    s = await held(harness)
    mine = await repo.Sagas(harness.pool).take_lease(s.id, "worker-a", 30)
    assert mine is not None
    # Someone else (a cancel, or a worker after our lease expired) moved it on.
    assert await repo.Sagas(harness.pool).take_lease(s.id, "worker-b", 30) is None  # not while our lease runs
    moved = await repo.Sagas(harness.pool).transition(mine, "worker-a", d.RELEASING, repo.Fields(outcome=d.EXPIRED))
    assert moved is not None and moved.version == mine.version + 1
    # The same write again (a stale copy of the row): the version token refuses it.
    assert await repo.Sagas(harness.pool).transition(mine, "worker-a", d.RELEASING, repo.Fields(outcome=d.EXPIRED)) is None
    # Right version, wrong owner: refused too.
    assert await repo.Sagas(harness.pool).transition(moved, "worker-b", d.EXPIRED) is None
    assert (await repo.Sagas(harness.pool).get(s.id)).state == d.RELEASING


async def test_concurrent_claims_never_share_a_saga(harness):
    ids = [(await held(harness, f"c-claim-{i}")).id for i in range(40)]
    await harness.pool.execute("UPDATE checkouts SET next_run_at = clock_timestamp() WHERE id = ANY($1::uuid[])",
                               ids)

    async def claimer(n: int) -> list[str]:
        got: list[str] = []
        while True:
            batch = await repo.Sagas(harness.pool).claim_due(f"w{n}", 3, 30)
            if not batch:
                return got
            got += [s.id for s in batch]

    results = await asyncio.gather(*(claimer(n) for n in range(6)))
    claimed = [i for r in results for i in r]
    assert sorted(claimed) == sorted(ids)  # every due saga once, none twice
    owners = await harness.pool.fetch("SELECT lease_owner, next_run_at > clock_timestamp() AS later "
                                      "FROM checkouts WHERE id = ANY($1::uuid[])", ids)
    assert len({r["lease_owner"] for r in owners}) == 40 and all(r["later"] for r in owners)


async def test_a_wake_up_during_a_step_is_not_lost(harness):
    """The payment changes (its trigger wakes the saga) while a worker holds the lease: the worker may not release the saga
    to sleep until its expiry; it must look again."""
    h = harness
    c = await h.service.create("c-wake", validate_create(h.booking.add_slot(), "", 0), "")
    paid = await h.service.pay("c-wake", c.id, "pm_card_3ds", "")
    s = await repo.Sagas(h.pool).take_lease(c.id, "worker-a", 30)
    assert s.state == d.AWAITING_ACTION
    await h.core.finalize(paid.payment.id, "succeeded", "webhook")  # the trigger wakes the saga
    row = await h.row(c.id)
    assert row["wakeup"] and row["lease_owner"] == "worker-a"
    assert row["next_run_at"] > await h.pool.fetchval("SELECT clock_timestamp()")  # not stolen meanwhile
    again = await repo.Sagas(h.pool).release(s, "worker-a", s.expire_time)
    assert isinstance(again, d.Saga) and again.lease_owner == "worker-a"  # refused: look again
    assert await repo.Sagas(h.pool).release(again, "worker-a", again.expire_time) is True


async def test_a_wake_up_of_a_free_saga_notifies_every_listener(harness):
    h = harness
    c = await h.service.create("c-notify", validate_create(h.booking.add_slot(), "", 0), "")
    paid = await h.service.pay("c-notify", c.id, "pm_card_3ds", "")
    heard: list[str] = []

    def on_notify(*args) -> None:
        heard.append(args[3])

    listener = await h.pool.acquire()
    try:
        await listener.add_listener(repo.WAKE_CHANNEL, on_notify)
        await h.core.finalize(paid.payment.id, "succeeded", "webhook")  # the trigger wakes the saga
        await wait_for(lambda: heard, timeout=5, message="NOTIFY")
        assert heard == [c.id]
        assert (await h.row(c.id))["next_run_at"] <= await h.pool.fetchval("SELECT clock_timestamp()")
    finally:
        await listener.remove_listener(repo.WAKE_CHANNEL, on_notify)
        await h.pool.release(listener)


async def test_two_concurrent_pays_charge_once(harness):
    h = harness
    c = await h.service.create("c-twice", validate_create(h.booking.add_slot(), "", 0), "")
    results = await asyncio.gather(*(h.service.pay("c-twice", c.id, "pm_card_ok", "") for _ in range(5)),
                                   return_exceptions=True)
    ok = [r for r in results if not isinstance(r, Exception)]
    assert len(ok) == 1 and ok[0].state == 6
    assert list(h.psp.charges.values()) == [1] and h.booking.effects["confirm"] == 1


async def test_a_transition_into_waiting_keeps_the_lease_when_woken_meanwhile(harness):
    h = harness
    c = await h.service.create("c-wake2", validate_create(h.booking.add_slot(), "", 0), "")
    paid = await h.service.pay("c-wake2", c.id, "pm_card_3ds", "")
    s = await repo.Sagas(h.pool).take_lease(c.id, "worker-a", 30)
    await h.core.finalize(paid.payment.id, "processing", "webhook")  # the trigger wakes the saga
    kept = await repo.Sagas(h.pool).transition(s, "worker-a", d.CHARGING, release=True, wake_at=s.expire_time)
    assert kept.lease_owner == "worker-a" and not (await h.row(c.id))["wakeup"]  # look again, flag consumed
    gone = await repo.Sagas(h.pool).transition(kept, "worker-a", d.AWAITING_ACTION, release=True, wake_at=s.expire_time)
    assert gone.lease_owner is None and gone.state == d.AWAITING_ACTION
    row = await h.row(c.id)
    assert row["next_run_at"] == s.expire_time and row["lease_until"] is None


async def test_the_claim_walks_the_live_sagas_by_next_run(harness):
    """The workers' queue query must be answerable from the live sagas' index of next runs
    (sagas_live_due: a row per saga not finished or scheduled), not a scan of every checkout ever
    made."""
    async with harness.pool.acquire() as conn:
        async with conn.transaction():
            await conn.execute("SET LOCAL enable_seqscan = off")  # a small test table would tempt the planner
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + repo.CLAIM_DUE, "w", 32, 30.0))
    assert "sagas_live_due" in plan, plan
    assert "Seq Scan" not in plan, plan
