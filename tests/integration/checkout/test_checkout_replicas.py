"""Several saga workers (replicas) on one database, racing webhooks, cancels and expiries: every saga
ends terminal, no step's effect happens twice, and every captured payment is exactly one completed
checkout or one refund (docs/architecture.md, invariant 4)."""
from __future__ import annotations

import asyncio
import random
import uuid

from cutylib.testing.procs import wait_for
from payments.checkout.domain import TERMINAL, validate_create

N = 40


async def test_three_replicas_race_webhooks_cancels_and_expiry(make_harness):
    h = make_harness()
    h.booking.delay["ConfirmHold"] = 0.01  # widen the window in which replicas could collide
    h.start_workers(3)
    rng = random.Random(5)
    customer = f"c-{uuid.uuid4().hex[:6]}"
    ids, payments = [], {}
    for i in range(N):
        c = await h.service.create(f"{customer}-{i}", validate_create(h.booking.add_slot(), "", 0), "")
        p = await h.service.pay(f"{customer}-{i}", c.id, "pm_card_3ds", "")
        ids.append((f"{customer}-{i}", c.id))
        payments[c.id] = p.payment.id
    cores = [h.new_core(f"webhook-{i}") for i in range(3)]

    async def chaos(cust: str, cid: str) -> None:
        pid = payments[cid]
        pi = (await h.core.get(pid)).psp_intent_id
        roll = rng.random()
        await asyncio.sleep(rng.random() * 0.05)
        if roll < 0.4:  # customer finishes 3-D Secure; the webhook arrives (sometimes twice)
            intent = h.psp.set_status(pi)
            for _ in range(rng.choice([1, 2])):
                await rng.choice(cores).finalize(pid, "succeeded", "webhook", intent=intent)
        elif roll < 0.6:  # captured, and the customer cancels before the webhook lands
            intent = h.psp.set_status(pi)
            await asyncio.gather(h.service.cancel(cust, cid),
                                 rng.choice(cores).finalize(pid, "succeeded", "webhook", intent=intent),
                                 return_exceptions=True)
        elif roll < 0.8:  # the hold runs out while the customer is still in 3-D Secure
            await h.pool.execute("UPDATE checkouts SET expire_time = clock_timestamp(), "
                                 "next_run_at = clock_timestamp() WHERE id = $1", uuid.UUID(cid))
        else:
            await h.service.cancel(cust, cid)

    await asyncio.gather(*(chaos(c, i) for c, i in ids))

    async def all_terminal():
        rows = await h.pool.fetch("SELECT state FROM checkouts WHERE id = ANY($1::uuid[])", [i for _, i in ids])
        return all(r["state"] in TERMINAL for r in rows)

    await wait_for(all_terminal, timeout=20, message="every saga terminal")
    rows = {str(r["id"]): r for r in await h.pool.fetch("SELECT * FROM checkouts WHERE id = ANY($1::uuid[])",
                                                         [i for _, i in ids])}
    completed = refunded = 0
    for cid, row in rows.items():
        payment = await h.core.get(payments[cid])
        hold = h.booking.holds[row["hold_id"]]
        if payment.status in ("succeeded", "refunded"):  # captured at some point
            assert (row["state"] == "COMPLETED") != (payment.status == "refunded"), (cid, row["state"])
        if row["state"] == "COMPLETED":
            completed += 1
            assert payment.status == "succeeded" and hold["status"] == "confirmed"
        elif row["state"] == "REFUNDED":
            refunded += 1
            assert payment.status == "refunded" and hold["status"] == "released"
        else:
            assert row["state"] in ("CANCELLED", "EXPIRED") and payment.status == "canceled", (cid, row["state"])
            assert hold["status"] == "released"
    # No step's effect twice: one confirm per completed, one refund per refunded, one charge per key.
    assert h.booking.effects["confirm"] == completed
    assert len(h.psp.refunds) == refunded
    assert all(n == 1 for n in h.psp.charges.values())
    assert completed + refunded == len(h.psp.charges)
    assert completed > 0 and refunded > 0
    events = await h.pool.fetchval("SELECT count(*) FROM payment_events WHERE checkout_id = ANY($1::uuid[]) "
                                   "AND source = 'saga'", [i for _, i in ids])
    assert events >= 4 * N
