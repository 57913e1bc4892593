"""Crash matrix after the sale (docs/payments.md, "Code claims", "Disputes"): the orchestrator SIGKILLs
itself before and after the code pool settles a claim's step (CUTY_CRASH_AT=claim_settle:before|after),
around the claim refund's PSP call (psp_refund:before|after) and around a dispute's evidence
submission (dispute_evidence:before|after), and is restarted; the admin's client retries with the
same Idempotency-Key until answered. Every claim must end resolved once: a replaced claim has exactly
one replacement delivered and its code revoked; a refunded one was refunded one code's price at the
PSP, once. Every dispute ends closed with its evidence recorded once."""
from __future__ import annotations

import uuid

import pytest_asyncio

from cuty.codepool.v1 import claims_pb2 as ccpb, claims_pb2_grpc as ccgrpc
from cuty.payments.v1 import claims_pb2 as rpb, claims_pb2_grpc as rgrpc
from codepool.claims_api import CALLERS as CODE_CLAIM_CALLERS
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import acting_channel
from payments.claims.grpc_api import CALLERS as CLAIM_CALLERS

from checkout_e2e import CheckoutStack, crash_at_each_point, md, persist, start_stack

PROC = "payments-0"
PRICE = 2500
ADMIN = md("admin-1", role="admin")


async def claimed(shop: CheckoutStack, quantity: int):
    """A completed purchase of `quantity` codes and an open claim on its first: (checkout, claim)."""
    customer = f"claim-{uuid.uuid4().hex[:8]}"
    product = await shop.new_product(stock=quantity + 2, price=PRICE)
    ck, pk = str(uuid.uuid4()), str(uuid.uuid4())  # a client retries with the same keys
    c = await persist(lambda: shop.create(customer, product=product, quantity=quantity, key=ck))
    await persist(lambda: shop.pay(customer, c.id, "pm_card_ok", key=pk))
    await shop.until(c.id, timeout=60)
    done = await persist(lambda: shop.get(c.id, customer))  # the buyer's view carries the codes
    async with acting_channel(shop.stack.codepool_addr, "codepool", CODE_CLAIM_CALLERS) as ch:
        claim = await ccgrpc.CodeClaimServiceStub(ch).OpenCodeClaim(ccpb.OpenCodeClaimRequest(
            checkout_id=c.id, code_id=done.codes[0].id, kind=ccpb.CLAIM_KIND_DOES_NOT_WORK, reason="invalid pin"),
            metadata=md(customer, str(uuid.uuid4())))
    return c.id, claim


async def resolve(shop: CheckoutStack, claim_id: str, resolution) -> ccpb.CodeClaim:
    key = str(uuid.uuid4())

    async def once():
        async with acting_channel(shop.stack.payments_addrs[0], "payments", CLAIM_CALLERS) as ch:
            return await rgrpc.ClaimServiceStub(ch).ResolveClaim(
                rpb.ResolveClaimRequest(claim_id=claim_id, resolution=resolution, note="crash matrix"),
                metadata=ADMIN + (("idempotency-key", key),), timeout=10)
    return await persist(once)


async def replace(shop):
    checkout, claim = await claimed(shop, 1)
    await resolve(shop, claim.id, rpb.CLAIM_RESOLUTION_REPLACE)
    return [(checkout, claim.id, "replaced")]


async def refund(shop):
    checkout, claim = await claimed(shop, 2)
    await resolve(shop, claim.id, rpb.CLAIM_RESOLUTION_REFUND)
    return [(checkout, claim.id, "refunded")]


async def disputed(shop):
    """A codes purchase the PSP disputes (pm_card_disputed): the evidence worker submits the evidence."""
    customer = f"dispute-{uuid.uuid4().hex[:8]}"
    product = await shop.new_product(stock=1, price=PRICE)
    ck, pk = str(uuid.uuid4()), str(uuid.uuid4())
    c = await persist(lambda: shop.create(customer, product=product, quantity=1, key=ck))
    await persist(lambda: shop.pay(customer, c.id, "pm_card_disputed", key=pk))
    await shop.until(c.id, timeout=60)
    return [(c.id, None, "disputed")]


MATRIX = [
    ("claim_settle:before", replace), ("claim_settle:after", replace),
    ("claim_settle:after", refund), ("psp_refund:before", refund), ("psp_refund:after", refund),
    ("dispute_evidence:before", disputed), ("dispute_evidence:after", disputed),
]


@pytest_asyncio.fixture(scope="module")
async def crashy(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("claim-crash"), CUTY_DISPUTE_EVIDENCE_POLL_SECONDS="0.3",
                          CUTY_DISPUTE_RECHECK_SECONDS="3",
                          # the PSP keeps retrying a webhook through the restarts (a real one does for days)
                          CUTY_PSP_WEBHOOK_MAX_ATTEMPTS="120")
    yield s
    await s.close()


async def test_sigkill_around_every_claim_step_then_recover(crashy):
    shop = crashy
    results = [x for batch in await crash_at_each_point(shop, MATRIX, PROC, timeout=60) for x in batch]
    cp, pay = shop.db["codepool"], shop.db["payments"]
    ledger = await shop.ledger()
    for checkout, claim_id, want in results:
        if want == "disputed":
            payment = await pay.fetchval("SELECT payment_id FROM checkouts WHERE id = $1", uuid.UUID(checkout))

            async def closed():
                return await pay.fetchval("SELECT status FROM disputes WHERE payment_id = $1", payment) in ("won", "lost")
            await wait_for(closed, timeout=60, interval=0.3, message="the dispute closed")
            d = await pay.fetchrow("SELECT * FROM disputes WHERE payment_id = $1", payment)
            assert d["status"] == "won" and d["evidence"] is not None, dict(d)
            submitted = await pay.fetchval("SELECT count(*) FROM payment_events WHERE payment_id = $1 AND "
                                           "note LIKE 'evidence submitted%'", payment)
            assert submitted <= 1  # recorded once (or taken from the PSP's closing word)
            continue
        row = await cp.fetchrow("SELECT * FROM code_claims WHERE id = $1", uuid.UUID(claim_id))
        assert row["status"] == want, (claim_id, row["status"])
        assert await cp.fetchval("SELECT status FROM codes WHERE id = $1", row["code_id"]) == "revoked"
        live = await cp.fetch("SELECT code_id FROM deliveries WHERE order_id = $1 AND status = 'delivered'", checkout)
        quantity = await cp.fetchval("SELECT quantity FROM reservations WHERE order_id = $1", checkout)
        intent = await pay.fetchval("SELECT psp_intent_id FROM payments WHERE checkout_id = $1", uuid.UUID(checkout))
        refunds = [r["amount"] for r in ledger["refunds"] if r["intent_id"] == intent]
        if want == "replaced":
            assert len(live) == quantity == 1 and live[0]["code_id"] == row["replacement_code_id"]
            assert refunds == []
        else:
            assert len(live) == quantity - 1
            assert refunds == [PRICE], (claim_id, refunds)
            assert await pay.fetchval("SELECT status FROM payments WHERE psp_intent_id = $1", intent) == \
                "partially_refunded"
        # each step of the claim audited once, whatever the crashes
        steps = await cp.fetch("SELECT action, count(*) AS n FROM audit_log WHERE order_id = $1 AND action LIKE 'claim%' "
                               "GROUP BY action", checkout)
        assert all(s["n"] == 1 for s in steps), [dict(s) for s in steps]
    # no code is delivered twice across the matrix
    assert await cp.fetchval("SELECT count(*) FROM (SELECT code_id FROM deliveries WHERE status = 'delivered' "
                             "GROUP BY code_id HAVING count(*) > 1) x") == 0
