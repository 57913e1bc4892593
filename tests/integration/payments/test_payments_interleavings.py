"""500 seeded interleavings of the synchronous answer, webhooks (duplicated, stale, out of order) and
reconciliation on one payment each, against the real PostgreSQL with real concurrent connections.

Oracle: the status only moves forward, exactly one transition to `succeeded` when the
PSP captured, the version rises once per accepted change, no terminal answer carries a secret.
"""
import asyncio
import random


from cutylib.testing.ids import new_id
from payments import domain, metrics as m
from payments.views import PaymentView

from cutylib.testing.fake_psp import FakePsp
from cutylib.testing.trust import TEST_MERCHANT

SEEDS = 500
PARALLEL = 10

# What the PSP does over time, per scenario (the last status is where it ends).
SCENARIOS = {
    "ok": ["succeeded"],
    "declined": ["failed"],
    "3ds_ok": ["requires_action", "succeeded"],
    "3ds_fail": ["requires_action", "failed"],
    "3ds_cancel": ["requires_action", "canceled"],
    "slow_ok": ["processing", "succeeded"],
    "3ds_slow_ok": ["requires_action", "processing", "succeeded"],
    "ok_refunded": ["succeeded", "refunded"],
}
PSP_STATUS = {"refunded": "succeeded"}


def intent_of(pi: str, status: str, amount: int) -> dict:
    return {"id": pi, "object": "payment_intent", "status": PSP_STATUS.get(status, status), "amount": amount,
            "amount_refunded": amount if status == "refunded" else 0, "client_secret": f"{pi}_secret_s",
            "next_action": {"redirect_url": f"https://psp/3ds/{pi}"} if status == "requires_action" else None,
            "last_payment_error": {"code": "card_declined"} if status == "failed" else None}


class RecordingPsp(FakePsp):
    def __init__(self) -> None:
        super().__init__()
        self.refunded: dict[str, asyncio.Event] = {}

    async def create_refund(self, idempotency_key, intent_id, metadata, amount=None):
        refund = await super().create_refund(idempotency_key, intent_id, metadata, amount)
        self.refunded[intent_id].set()
        return refund


async def one_interleaving(seed: int, creator, workers, psp: RecordingPsp, pool) -> None:
    rng = random.Random(seed)
    name = rng.choice(sorted(SCENARIOS))
    truth = SCENARIOS[name]
    key = new_id()
    p = await creator.create_and_charge(checkout_id=new_id(), amount_minor=1000, currency="TRY",
                                        payment_method="pm_card_ok", idempotency_key=key, customer_id="c",
                                        merchant_id=TEST_MERCHANT)
    assert p.status == "created"
    pi = f"pi_{seed}_{new_id()[:8]}"
    final_psp = "succeeded" if name == "ok_refunded" else truth[-1]  # the refund itself flips it
    psp.intents[pi] = intent_of(pi, final_psp, 1000)
    psp.by_key[key] = pi  # a replayed create (refund before we know the intent) finds this intent
    psp.refunded[pi] = asyncio.Event()

    plan: list[tuple[str, str]] = [("sync", truth[0])]
    for status in truth:
        plan += [("webhook", status)] * rng.randint(1, 3)
    if "succeeded" in truth and rng.random() < 0.5:
        plan.append(("webhook", "processing"))  # the stale event that arrives after success
    if rng.random() < 0.7:
        plan.append(("reconcile", rng.choice(truth[:-1] or truth) if name == "ok_refunded" else rng.choice(truth)))
    if name == "ok_refunded":
        plan.append(("refund", "refunded"))
    rng.shuffle(plan)
    answers: list[PaymentView] = []

    async def observe(source: str, status: str) -> None:
        # Jitter to vary the interleaving; it synchronises nothing.
        await asyncio.sleep(rng.random() * 0.004)
        if source == "refund":
            answers.append(await creator.refund(p.id, f"refund-{p.id}"))
            return
        if status == "refunded":
            await psp.refunded[pi].wait()  # a charge.refunded event exists only after the refund
            obj = {"id": f"re_{pi}", "object": "refund", "payment_intent": pi}
        else:
            obj = intent_of(pi, status, 1000)
        if source == "sync":
            answers.append(await creator.finalize(p.id, status, "sync", intent=obj))
            return
        worker = rng.choice(workers)
        for _ in range(500):  # deferred while another worker holds the lease: the retry worker's job
            view = await worker.finalize_leased(p.id, status, source, intent=obj)
            if view is not None:
                answers.append(view)
                return
            await asyncio.sleep(0.001)
        raise AssertionError(f"seed {seed}: lease never free")

    await asyncio.gather(*(observe(s, st) for s, st in plan))

    ctx = f"seed {seed} scenario {name} plan {plan}"
    final = await creator.get(p.id)
    assert final.status == truth[-1], ctx
    events = await pool.fetch("SELECT from_status, to_status, version, note FROM payment_events"
                              " WHERE payment_id = $1 ORDER BY seq", p.id)
    assert [e["version"] for e in events] == list(range(1, len(events) + 1)), ctx
    assert final.version == len(events), ctx
    assert (events[0]["from_status"], events[0]["to_status"]) == (None, "created"), ctx
    for prev, e in zip(events, events[1:]):
        assert e["from_status"] == prev["to_status"], ctx
        # A refund's own events (reserved, settled after the PSP said "refunded") may
        # keep the status; every other event is a forward transition.
        assert domain.can_transition(e["from_status"], e["to_status"]) or (
            e["from_status"] == e["to_status"] and "refund" in e["note"]), ctx
    assert sum(e["to_status"] == "succeeded" and e["from_status"] != "succeeded" for e in events) == (
        1 if "succeeded" in truth else 0), ctx
    # Invariant 6 where it is kept: the stored row of a terminal payment holds no customer action
    # (the views below could not show one anyway).
    row = await pool.fetchrow("SELECT redirect_url, client_secret FROM payments WHERE id = $1", p.id)
    if final.terminal:
        assert (row["redirect_url"], row["client_secret"]) == (None, None), ctx
    for a in answers + [final]:
        if a.terminal:
            assert a.redirect_url is None and a.client_secret is None, ctx
            proto = a.to_proto()
            assert not proto.HasField("next_action") and not proto.client_secret, ctx


async def test_500_seeded_interleavings(make_core, payments_pool):
    down = FakePsp()
    down.unavailable["create"] = 10 ** 9  # the creator's charge never answers: rows stay `created` for the race
    psp = RecordingPsp()
    creator = make_core(psp=psp)
    creator.psp = psp
    creating = make_core(psp=down)
    workers = [make_core(psp=psp) for _ in range(3)]

    class Creator:  # create through the unanswering PSP, everything else through the recording one
        create_and_charge = creating.create_and_charge
        finalize = creator.finalize
        refund = creator.refund
        get = creator.get

    for start in range(0, SEEDS, PARALLEL):
        await asyncio.gather(*(one_interleaving(seed, Creator, workers, psp, payments_pool)
                               for seed in range(start, start + PARALLEL)))
    conflicts = sum(w.metrics.value(m.VERSION_CONFLICTS) for w in workers) + creator.metrics.value(m.VERSION_CONFLICTS)
    assert conflicts > 0, "the interleavings never raced on a version: the test would prove nothing"
