"""An internal client on the public gRPC API as real processes: the example point of sale
(examples/pos_checkout.py, cuty-client as installed) with a certificate of its own, registered in
the services' CUTY_INTERNAL_CLIENTS, acting as itself and for a customer whose token it forwards;
an unregistered certificate refused; a slot race answered with SlotTaken and its alternatives."""
from __future__ import annotations

import asyncio
import json
import pathlib
import secrets
import subprocess
import sys

import pytest
import pytest_asyncio

from checkout_e2e import start_stack
from cuty_client import CutyClient, NotFound, PermissionDenied, SlotTaken, Tls, Unauthenticated
from cutylib.config import DEV_JWT_SECRET
from cutylib.testing.procs import wait_for
from cutylib.tokens import issue

ROOT = pathlib.Path(__file__).resolve().parents[3]
TILL = "pos-till-1"
CLIENTS = {"clients": [{"identity": "pos", "acts_as": {"role": "customer", "subject": TILL}, "users": ["customer"]}]}


def token(subject: str, role: str = "customer") -> str:
    return issue(DEV_JWT_SECRET, subject, role, ttl_seconds=600)


@pytest_asyncio.fixture(scope="module")
async def shop(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("internal-client"), CUTY_INTERNAL_CLIENTS=json.dumps(CLIENTS))
    yield s
    await s.close()


def tls(shop, identity: str) -> Tls:
    p = shop.stack.pki.paths(identity)  # issued by the stack's CA on first use
    return Tls(ca=p.ca[0], cert=p.cert, key=p.key)


def client(shop, identity: str = "pos") -> CutyClient:
    st = shop.stack
    return CutyClient(tls(shop, identity), payments=st.payments_addrs[0], booking=st.booking_addr,
                      codepool=st.codepool_addr, deadline=15)


async def checkout_row(shop, checkout_id: str):
    return await shop.db["payments"].fetchrow("SELECT customer_id, state FROM checkouts WHERE id = $1", checkout_id)


async def completed(shop, checkout_id: str) -> None:
    async def done():
        return (await checkout_row(shop, checkout_id))["state"] == "COMPLETED"
    await wait_for(done, timeout=30, message=f"checkout {checkout_id} COMPLETED")


async def test_example_point_of_sale_books_sells_and_sells_for_a_customer(shop):
    await shop.new_slots(1)
    product = await shop.new_product(stock=3)
    customer = f"alice-{secrets.token_hex(4)}"
    p = tls(shop, "pos")
    st = shop.stack
    run = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "examples" / "pos_checkout.py"), "--ca", str(p.ca), "--cert", str(p.cert),
        "--key", str(p.key), "--payments", st.payments_addrs[0], "--booking", st.booking_addr,
        "--codepool", st.codepool_addr, "--salon", shop.salon_id, "--product", product,
        "--customer-token", token(customer), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(run.communicate(), 90)
    assert run.returncode == 0, (out.decode(), err.decode()[-3000:])
    steps = {line["step"]: line for line in map(json.loads, out.decode().splitlines())}
    assert set(steps) == {"slot", "code", "code-for-customer"}, steps
    # Every purchase completed, the till's in the till's name, the customer's in the customer's.
    for step, owner in (("slot", TILL), ("code", TILL), ("code-for-customer", customer)):
        cid = steps[step]["checkout_id"]
        await completed(shop, cid)
        assert (await checkout_row(shop, cid))["customer_id"] == owner, step
    delivered = await shop.db["codepool"].fetchval(
        "SELECT count(*) FROM codes WHERE product_id = $1 AND status = 'delivered'", product)
    assert delivered == 2
    # The customer sees their own checkout, not the till's (NOT_FOUND, as a missing one).
    async with client(shop) as cuty:
        as_alice = cuty.for_user(token(customer))
        assert (await as_alice.get_checkout(steps["code-for-customer"]["checkout_id"])).product_id == product
        with pytest.raises(NotFound):
            await as_alice.get_checkout(steps["code"]["checkout_id"])


async def test_unregistered_certificate_and_private_rpcs_are_refused(shop):
    product = await shop.new_product(stock=1)
    before = await shop.db["payments"].fetchval("SELECT count(*) FROM checkouts")
    async with client(shop, "kiosk") as kiosk:  # a certificate of the same CA, not registered
        with pytest.raises(PermissionDenied) as e:
            await kiosk.create_checkout(product_id=product, quantity=1, payment_method="pm_card_ok")
        assert "CUTY_INTERNAL_CLIENTS" in e.value.message
    async with client(shop) as pos:
        # A system-only RPC (holding a slot is the orchestrator's), even called by hand.
        from cuty_client import booking_pb2
        from cuty_client._pb.cuty.booking.v1 import booking_pb2_grpc
        with pytest.raises(PermissionDenied) as e:
            await pos.call("booking", booking_pb2_grpc.BookingServiceStub, "HoldSlot",
                           booking_pb2.HoldSlotRequest(slot_id=shop.resource_id, request_id="x"))
        assert "only the public API" in e.value.message
        # A role the route does not admit: the till is a customer, stock is for staff.
        with pytest.raises(PermissionDenied):
            await pos.get_stock(product)
        # A forwarded token that is not the identity provider's.
        with pytest.raises(Unauthenticated):
            await pos.for_user(issue("another-secret-of-at-least-32-bytes!", "mallory", "customer")).list_checkouts()
        # A user role the client may not bring.
        with pytest.raises(PermissionDenied):
            await pos.for_user(token("boss", "operator")).list_checkouts()
    assert await shop.db["payments"].fetchval("SELECT count(*) FROM checkouts") == before


async def test_slot_race_gives_slot_taken_with_alternatives(shop):
    # Enough other slots that every loser has some left after the others were offered theirs.
    slot, *_others = await shop.new_slots(10)
    buyers = [f"racer-{i}-{secrets.token_hex(3)}" for i in range(5)]
    async with client(shop) as pos:
        results = await asyncio.gather(
            *(pos.for_user(token(b)).create_checkout(slot_id=slot, payment_method="pm_card_ok") for b in buyers),
            return_exceptions=True)
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, SlotTaken)]
    assert len(won) == 1 and len(lost) == 4, results
    for e in lost:
        assert e.slot_id == slot and e.alternatives and all(a.id != slot for a in e.alternatives)
        assert e.problem()["status"] == 409 and e.reason == "slot-unavailable"
    await completed(shop, won[0].id)
    # The slot was sold once, to the one buyer told so; the losers' checkouts hold nothing.
    rows = await shop.db["payments"].fetch(
        "SELECT id, customer_id FROM checkouts WHERE slot_id = $1 AND state = 'COMPLETED'", slot)
    assert [(str(r["id"]), r["customer_id"] in buyers) for r in rows] == [(won[0].id, True)]
