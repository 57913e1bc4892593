"""The invariant auditor across real processes (docs/payments.md, "The invariant auditor"): on the
stack's own databases and PSP, a day of clean purchases reports nothing; each kind of drift injected
into the data (a delivery row deleted, a code delivered twice, a hold changed, a charge and a refund
made at the PSP behind the platform's back, a payment's record changed, codes delivered and a
booking confirmed outside any checkout) is reported by `payments ops audit --since` with the offending ids, then recorded by the
periodic job (one row per violation) and counted in its metric. And the poller of lost dispute
webhooks records a dispute whose webhook the PSP never sent. Where the summaries agree (booking's,
the code pool's, the PSP's balance report against payments' own sums) no row is read; each drift
makes only its bucket disagree and be read."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import subprocess
import sys
import uuid
from datetime import datetime, timezone

import httpx
import pytest_asyncio

from cuty.booking.v1 import booking_pb2 as bpb
from cuty.codepool.v1 import codepool_pb2 as cpb
from cutylib.testing.procs import as_service_role, wait_for

from checkout_e2e import name, start_stack

# The periodic auditor starts off (interval 0): the test restarts payments with it on once the drift
# is in, so that the job sees the drift however slowly this machine runs the purchases.
ENV = {"CUTY_AUDIT_INTERVAL_SECONDS": 0, "CUTY_AUDIT_WINDOW_SECONDS": 5, "CUTY_AUDIT_SLACK_SECONDS": 5,
       "CUTY_AUDIT_START_BACK_SECONDS": 600, "CUTY_DISPUTE_POLL_SECONDS": 1, "CUTY_DISPUTE_POLL_GRACE_SECONDS": 0,
       "CUTY_PSP_DISPUTE_DELAY_MS": 100, "CUTY_PSP_DISPUTE_DECIDE_MS": 100}


@pytest_asyncio.fixture(scope="module")
async def shop(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("checkout-e2e-audit"), **ENV)
    yield s
    await s.close()


def run(shop, *args: str) -> subprocess.CompletedProcess:
    """`python -m payments ...` as it runs in the payments pod: its identity, database and keys."""
    env = as_service_role("payments", dict(shop.stack.procs["payments-0"].env))
    return subprocess.run([sys.executable, "-m", "payments", *args], env=env, capture_output=True, text=True,
                          timeout=120)


async def buy(shop, *, slot: str = "", product: str = "", quantity: int = 0, method: str = "pm_card_ok"):
    me = "cust-" + uuid.uuid4().hex[:8]
    created = await shop.create(me, slot=slot, product=product, quantity=quantity)
    await shop.pay(me, created.id, method)
    done = await shop.until(created.id)
    assert name(done.state) == "COMPLETED", name(done.state)
    return await shop.db["payments"].fetchrow(
        "SELECT c.id::text, c.hold_id, c.order_id::text, p.id::text AS payment_id, p.psp_intent_id "
        "FROM checkouts c JOIN payments p ON p.id = c.payment_id WHERE c.id = $1::uuid", done.id)


async def audit(shop, since: str) -> tuple[int, list[dict]]:
    out = await asyncio.to_thread(run, shop, "ops", "audit", "--since", since, "--settle", "0", "--json")
    assert out.returncode in (0, 3), out.stderr
    return out.returncode, json.loads(out.stdout)


async def as_owner(db, *statements: tuple) -> None:
    """Drift written as the tables' owner, triggers off (what no service path can do)."""
    async with db.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        for sql, *args in statements:
            await conn.execute(sql, *args)


async def drift_beside_payments(shop, product: str, slot: str, b1, c1, c2, c3) -> tuple[str, object]:
    """Drift in booking and the code pool: c1's delivery deleted and c2's code delivered to c3 too
    (then taken back, so the unique index does not stop it), as the tables' owner; b1's hold
    confirmed with another payment; codes delivered for an order no checkout knows and a booking
    confirmed that no checkout holds (their own APIs, as the orchestrator). Returns that order's id
    and that hold."""
    await as_owner(shop.db["codepool"],
                   ("DELETE FROM deliveries WHERE order_id = $1", c1["order_id"]),
                   ("INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, "
                    "status, reserved_at, delivered_at, revoked_at) SELECT merchant_id, $2, order_item_id || '-x', "
                    "product_id, customer_id, code_id, 'revoked', reserved_at, delivered_at, clock_timestamp() "
                    "FROM deliveries WHERE order_id = $1", c2["order_id"], c3["order_id"]))
    await as_owner(shop.db["booking"], ("UPDATE holds SET payment_ref = 'pay-someone-else' WHERE id = $1::uuid",
                                        b1["hold_id"]))
    lone = str(uuid.uuid4())
    await shop.codepool.ReserveCodes(cpb.ReserveCodesRequest(order_id=lone, order_item_id=lone + "/1",
                                                             product_id=product, quantity=1, customer_id="cust-x"))
    await shop.codepool.DeliverCodes(cpb.DeliverCodesRequest(order_id=lone, payment_transaction_id="tx-" + lone))
    held = await shop.booking.HoldSlot(bpb.HoldSlotRequest(slot_id=slot, customer_id="cust-y",
                                                           request_id=str(uuid.uuid4())))
    await shop.booking.ConfirmHold(bpb.ConfirmHoldRequest(hold_id=held.id, payment_ref=str(uuid.uuid4())))
    return lone, held


async def test_clean_purchases_report_nothing_and_each_drift_is_reported(shop):
    since = (await shop.db["payments"].fetchval("SELECT clock_timestamp() - interval '1 second'")).isoformat()
    slots = await shop.new_slots(5)
    product = await shop.new_product(stock=12)
    b1, b2, b3, clean_b = [await buy(shop, slot=s) for s in slots[:4]]
    c1, c2, c3, c4 = [await buy(shop, product=product, quantity=1) for _ in range(4)]
    clean_c = await buy(shop, product=product, quantity=2)

    code, found = await audit(shop, since)
    assert (code, found) == (0, [])  # a clean day: nothing

    async with httpx.AsyncClient(base_url=shop.stack.psp_url, timeout=10) as psp:
        # a charge at the PSP that no payment made
        stray = (await psp.post("/v1/payment_intents", headers={"Idempotency-Key": secrets.token_hex(8)},
                                json={"amount": 999, "currency": "TRY", "payment_method": "pm_card_ok"})).json()
        # a refund at the PSP that payments never asked for
        refund = (await psp.post("/v1/refunds", headers={"Idempotency-Key": secrets.token_hex(8)},
                                 json={"payment_intent": b2["psp_intent_id"], "amount": 1000})).json()
    code_of = {o: (await shop.db["codepool"].fetchval("SELECT code_id::text FROM deliveries WHERE order_id = $1", o))
               for o in (c1["order_id"], c2["order_id"])}
    lone, held = await drift_beside_payments(shop, product, slots[4], b1, c1, c2, c3)
    await as_owner(shop.db["payments"],
                   ("UPDATE payments SET status = 'failed', failure_reason = 'card_declined' WHERE id = $1::uuid",
                    c4["payment_id"]),
                   ("UPDATE payments SET psp_intent_id = $2 WHERE id = $1::uuid", b3["payment_id"],
                    "pi_" + secrets.token_hex(12)))

    expected = {
        ("psp_charge_unknown", stray["id"]), ("psp_charge_unknown", b3["psp_intent_id"]),
        ("psp_refund_unknown", refund["id"]), ("amount_mismatch", b2["payment_id"]),
        ("payment_unresolved", c4["payment_id"]), ("charge_missing", b3["payment_id"]),
        ("hold_not_confirmed", b1["id"]), ("hold_without_checkout", held.id),
        ("codes_count_mismatch", c1["id"]), ("codes_count_mismatch", c3["id"]),
        ("code_delivered_twice", code_of[c2["order_id"]]), ("codes_without_checkout", lone)}

    def named(f: dict) -> tuple[str, str]:
        # PSP-side findings are named by the intent here (the charge id is the PSP's)
        return f["kind"], (f["psp_id"] if f["kind"] == "psp_charge_unknown" else f["subject"])

    code, found = await audit(shop, since)
    assert code == 3
    assert {named(f) for f in found} == expected
    assert not {clean_b["id"], clean_c["id"]} & {f["checkout_id"] for f in found}
    (twice,) = [f for f in found if f["kind"] == "code_delivered_twice"]
    assert set(twice["other_id"].split(",")) == {c2["order_id"], c3["order_id"]}

    # The periodic job, switched on: it records each violation once and counts it.
    proc = shop.stack.procs["payments-0"]
    # flat out (no duty-cycle rest): 120 windows to catch up, and this is about what it records
    proc.env.update(CUTY_AUDIT_INTERVAL_SECONDS="0.5", CUTY_AUDIT_SETTLE_SECONDS="0", CUTY_AUDIT_DUTY_CYCLE="1")
    await shop.stack.restart("payments-0")

    async def recorded():
        rows = await shop.db["payments"].fetch("SELECT kind, subject, psp_id FROM audit_findings")
        return {named(dict(r)) for r in rows} >= expected
    await wait_for(recorded, timeout=60, interval=0.5, message="the periodic auditor's findings")
    assert await shop.db["payments"].fetchval("SELECT count(*) FROM audit_findings") == len(expected)
    metrics_port = shop.stack.metrics_ports["payments-0"]
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    counted = {line.split('kind="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("cuty_payments_audit_findings_total{")}
    assert sum(counted.values()) == len(expected) and counted["codes_count_mismatch"] == 2
    listed = await asyncio.to_thread(run, shop, "ops", "audit", "--since", since, "--recorded")
    assert listed.returncode == 3 and lone in listed.stdout and held.id in listed.stdout


async def test_a_dispute_whose_webhook_was_lost_is_recorded_by_the_poller(shop):
    product = await shop.new_product(stock=1)
    bought = await buy(shop, product=product, quantity=1, method="pm_card_disputed_webhook_lost")

    async def recorded():
        return await shop.db["payments"].fetchrow("SELECT * FROM disputes WHERE payment_id = $1::uuid",
                                                  bought["payment_id"])
    await wait_for(recorded, timeout=30, interval=0.3, message="the dispute, recorded by the poller")
    d = await recorded()
    assert d["status"] in ("needs_response", "under_review", "won") and d["checkout_id"] == uuid.UUID(bought["id"])
    events = await shop.db["payments"].fetch("SELECT event_id FROM psp_events WHERE payment_id = $1::uuid "
                                             "AND type LIKE 'charge.dispute.%'", bought["payment_id"])
    assert events and all(e["event_id"].startswith("poll:") for e in events)  # no webhook brought it
    timeline = await shop.db["payments"].fetch("SELECT to_status FROM payment_events WHERE payment_id = $1::uuid "
                                               "AND source = 'dispute' ORDER BY seq", bought["payment_id"])
    assert timeline[0]["to_status"] == "dispute.needs_response" or timeline[0]["to_status"].startswith("dispute.")


class CountingPsp:
    """A PSP client whose calls are remembered (name, keyword arguments) before they go out."""

    def __init__(self, psp):
        self.psp, self.asked = psp, []

    def __getattr__(self, name):
        call = getattr(self.psp, name)

        async def counted(*args, **kw):
            self.asked.append((name, kw))
            return await call(*args, **kw)
        return counted


class Counting:
    """A stub whose calls are remembered (name, request) before they go out."""

    def __init__(self, stub):
        self.stub, self.asked = stub, []

    def __getattr__(self, name):
        call = getattr(self.stub, name)

        def counted(request, **kw):
            self.asked.append((name, request))
            return call(request, **kw)
        return counted


async def test_a_window_that_agrees_reads_no_rows_and_each_drift_makes_its_bucket_disagree(shop):
    """The per-bucket summaries (cutylib.digests): where payments' checkouts and booking's / the
    code pool's facts agree, no digest page is read; each kind of drift on their side makes the
    bucket of its hold or order disagree, and only the disagreeing buckets are paged and checked."""
    from cutylib import digests
    from payments.audit import AuditSettings, Auditor
    from payments.psp import PspClient

    db = shop.db["payments"]
    # from now: no purchase of an earlier test (its order reserved after its checkout was created)
    # straddles the window's start
    since = await db.fetchval("SELECT clock_timestamp()")
    slots = await shop.new_slots(3)
    product = await shop.new_product(stock=6)
    b1, b2 = [await buy(shop, slot=s) for s in slots[:2]]
    c1, c2, c3 = [await buy(shop, product=product, quantity=1) for _ in range(3)]
    until = await db.fetchval("SELECT clock_timestamp()")
    booking, codepool = Counting(shop.booking), Counting(shop.codepool)
    psp = PspClient(shop.stack.psp_url, timeout=10)
    # one window for the whole test: no purchase straddles a window's edge
    job = Auditor(db, booking, codepool, psp, settings=AuditSettings(window_seconds=3600, slack_seconds=60,
                                                                     interval_seconds=0))
    try:
        (clean,) = await job.audit_range(since, until)
        assert clean.findings == [] and clean.checkouts >= 5 and clean.charges >= 5
        assert clean.drilled == {"holds": 0, "orders": 0, "charges": 0} and clean.rows == 0  # no row moved
        assert [n for n, _ in booking.asked + codepool.asked] == ["SummarizeHolds", "SummarizeDeliveries"]

        # drift on booking's and the code pool's side
        code_of = await shop.db["codepool"].fetchval("SELECT code_id::text FROM deliveries WHERE order_id = $1",
                                                     c2["order_id"])
        lone, held = await drift_beside_payments(shop, product, slots[2], b1, c1, c2, c3)
        until = await db.fetchval("SELECT clock_timestamp()")
        booking.asked.clear()
        codepool.asked.clear()

        (drifted,) = await job.audit_range(since, until)
        found = {(f.kind, f.subject) for f in drifted.findings}
        assert found == {("hold_not_confirmed", b1["id"]), ("hold_without_checkout", held.id),
                         ("codes_count_mismatch", c1["id"]), ("codes_count_mismatch", c3["id"]),
                         ("code_delivered_twice", code_of), ("codes_without_checkout", lone)}
        n = drifted.buckets
        (hold_page,) = [r for name_, r in booking.asked if name_ == "DigestHolds"]
        (order_page,) = [r for name_, r in codepool.asked if name_ == "DigestDeliveries"]
        assert hold_page.bucket_count == order_page.bucket_count == n
        # exactly the buckets of the drifted holds and orders were paged (c2's code is shared with c3's
        # order now: both orders' facts moved)
        assert set(hold_page.buckets) == {digests.bucket_of(h, n) for h in (b1["hold_id"], held.id)}
        assert set(order_page.buckets) == {digests.bucket_of(o, n)
                                           for o in (c1["order_id"], c2["order_id"], c3["order_id"], lone)}
        # summaries off (CUTY_AUDIT_SUMMARIES=0): every row read, the same findings
        rows = Auditor(db, booking, codepool, psp, settings=dataclasses.replace(job.settings, summaries=False))
        booking.asked.clear()
        (whole,) = await rows.audit_range(since, until)
        assert {(f.kind, f.subject) for f in whole.findings} == found
        assert [(name_, r.bucket_count) for name_, r in booking.asked] == [("DigestHolds", 0)]
    finally:
        await psp.aclose()


async def test_money_drift_makes_its_charge_bucket_disagree_in_the_psp_balance_report(shop):
    """The money side of the summaries: where payments' captured payments and the PSP's balance
    report agree, no charge is listed and no checkout read; drift at the PSP (a refund behind the
    platform's back, a stray charge) and in payments (a captured payment recorded as failed) makes
    exactly those intents' buckets disagree, only their charges are listed and checked, and each is
    reported as reading every row reports it. A charge captured after its checkout's window ended
    makes its bucket disagree in both windows, is read, and is found."""
    from cutylib import digests
    from payments.audit import AuditSettings, Auditor
    from payments.psp import PspClient

    db = shop.db["payments"]
    since = await db.fetchval("SELECT clock_timestamp()")
    slots = await shop.new_slots(2)
    product = await shop.new_product(stock=4)
    b1, b2 = [await buy(shop, slot=s) for s in slots]
    c1, c2 = [await buy(shop, product=product, quantity=1) for _ in range(2)]
    psp = CountingPsp(PspClient(shop.stack.psp_url, timeout=10))
    job = Auditor(db, shop.booking, shop.codepool, psp, settings=AuditSettings(window_seconds=3600, slack_seconds=60,
                                                                               interval_seconds=0))
    try:
        until = await db.fetchval("SELECT clock_timestamp()")
        (clean,) = await job.audit_range(since, until)
        assert clean.findings == [] and clean.drilled["charges"] == 0 and clean.rows == 0
        assert sorted(n for n, _ in psp.asked) == ["balance_report", "list_refunds"]  # no charge listed

        # a window's edge between b1's checkout and its charge's capture: the charge is in the next
        # window's report, the checkout in this one's sums; both buckets disagree, are read, and the
        # charge is found (in the slack, then by a second look): nothing to report
        created = await db.fetchval("SELECT created_at FROM checkouts WHERE id = $1::uuid", b1["id"])
        page = await psp.psp.list_charges(since.timestamp(), until.timestamp())
        captured = {c["payment_intent"]: c["created"] for c in page["data"]}[b1["psp_intent_id"]]
        edge = created + (datetime.fromtimestamp(captured, timezone.utc) - created) / 2
        (before,) = await job.audit_range(since, edge)
        (after,) = await job.audit_range(edge, until)
        assert before.findings == after.findings == []
        assert before.drilled["charges"] >= 1 and after.drilled["charges"] >= 1

        async with httpx.AsyncClient(base_url=shop.stack.psp_url, timeout=10) as http:
            stray = (await http.post("/v1/payment_intents", headers={"Idempotency-Key": secrets.token_hex(8)},
                                     json={"amount": 777, "currency": "TRY", "payment_method": "pm_card_ok"})).json()
            refund = (await http.post("/v1/refunds", headers={"Idempotency-Key": secrets.token_hex(8)},
                                      json={"payment_intent": b2["psp_intent_id"], "amount": 500})).json()
        await as_owner(db, ("UPDATE payments SET status = 'failed', failure_reason = 'card_declined' "
                            "WHERE id = $1::uuid", c1["payment_id"]))
        until = await db.fetchval("SELECT clock_timestamp()")
        psp.asked.clear()
        (drifted,) = await job.audit_range(since, until)
        found = {(f.kind, f.psp_id if f.kind == "psp_charge_unknown" else f.subject) for f in drifted.findings}
        assert found == {("psp_charge_unknown", stray["id"]), ("amount_mismatch", b2["payment_id"]),
                         ("payment_unresolved", c1["payment_id"]), ("psp_refund_unknown", refund["id"])}
        n = drifted.buckets
        drilled = {digests.bucket_of(i, n) for i in (stray["id"], b2["psp_intent_id"], c1["psp_intent_id"])}
        (listed,) = [kw for name_, kw in psp.asked if name_ == "list_charges"]
        assert (listed["bucket_count"], set(listed["buckets"])) == (n, drilled)
        assert drifted.drilled["charges"] == len(drilled) and drifted.drilled["holds"] == drifted.drilled["orders"] == 0
        # payments' rows read: the checkouts of those buckets only (c2's and b1's agree)
        assert 2 <= drifted.rows <= drifted.checkouts
        # every row read (CUTY_AUDIT_SUMMARIES=0): the same findings
        rows = Auditor(db, shop.booking, shop.codepool, psp, settings=dataclasses.replace(job.settings, summaries=False))
        (whole,) = await rows.audit_range(since, until)
        assert {(f.kind, f.psp_id if f.kind == "psp_charge_unknown" else f.subject) for f in whole.findings} == found
    finally:
        await psp.psp.aclose()
