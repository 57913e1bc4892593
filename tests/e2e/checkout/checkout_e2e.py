"""Helpers of the checkout e2e tests: a started Stack plus stubs, catalogue set-up, checks of the
booking / code-pool databases and the PSP ledger, and the invariants of docs/architecture.md as one oracle."""
from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
import uuid
from datetime import datetime, timedelta, timezone

import asyncpg
import grpc
import httpx
import jwt

from cuty.booking.v1 import booking_pb2 as bpb, booking_pb2_grpc
from cuty.codepool.v1 import codepool_pb2 as cpb, codepool_pb2_grpc
from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2 as pb, checkout_pb2_grpc
from cutylib.config import DEV_JWT_SECRET, with_database
from cutylib.timestamps import to_timestamp
from booking.grpc_api import CALLERS as BOOKING_CALLERS
from codepool.grpc_api import CALLERS as CODEPOOL_CALLERS
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import acting_channel, user
from payments.checkout.grpc_api import CALLERS as CHECKOUT_CALLERS
from payments.grpc_api import CALLERS as PAYMENT_CALLERS
from cutylib.testing.stack import Stack

TERMINAL = {pb.CHECKOUT_STATE_COMPLETED, pb.CHECKOUT_STATE_REJECTED, pb.CHECKOUT_STATE_FAILED, pb.CHECKOUT_STATE_EXPIRED, pb.CHECKOUT_STATE_CANCELLED, pb.CHECKOUT_STATE_REFUNDED,
            pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE}


def name(state: int) -> str:
    return pb.CheckoutState.Name(state).removeprefix("CHECKOUT_STATE_")  # as the row spells it


ADMIN = user("e2e-admin", "admin")
STAFF = user("e2e-staff", "staff")
# Tests act where the gateway and the orchestrator stand, each RPC with a certificate its table allows.
PAYMENTS_CALLERS = {**CHECKOUT_CALLERS, **PAYMENT_CALLERS}


def customer_headers() -> dict[str, str]:
    """A new customer's bearer token for the gateway (the development JWT secret)."""
    now = int(time.time())
    token = jwt.encode({"sub": f"cust-{uuid.uuid4().hex[:8]}", "role": "customer", "iat": now, "exp": now + 600},
                       DEV_JWT_SECRET, algorithm="HS256")
    return {"Authorization": f"Bearer {token}"}


def md(customer: str | None, key: str | None = None, role: str = "customer"):
    out = list(user(customer, role)) if customer else []
    if key:
        out.append(("idempotency-key", key))
    return tuple(out)


class CheckoutStack:
    def __init__(self, stack: Stack, pools: dict[str, asyncpg.Pool]):
        self.stack = stack
        self.db = pools
        self._slot_hours = itertools.count(1)
        self.resource_id = ""

    async def open(self) -> "CheckoutStack":
        pki = self.stack.pki
        self._channels = [acting_channel(a, "payments", PAYMENTS_CALLERS, pki=pki) for a in self.stack.payments_addrs]
        self._booking_ch = acting_channel(self.stack.booking_addr, "booking", BOOKING_CALLERS, pki=pki)
        self._codepool_ch = acting_channel(self.stack.codepool_addr, "codepool", CODEPOOL_CALLERS, pki=pki)
        self.booking = booking_pb2_grpc.BookingServiceStub(self._booking_ch)
        self.codepool = codepool_pb2_grpc.CodePoolServiceStub(self._codepool_ch)
        salon = await self.booking.CreateSalon(bpb.CreateSalonRequest(name="Cuty e2e", time_zone="Europe/Istanbul"),
                                               metadata=ADMIN)
        self.resource_id = (await self.booking.CreateResource(
            bpb.CreateResourceRequest(salon_id=salon.id, name="Chair 1"), metadata=ADMIN)).id
        self.salon_id = salon.id
        self._base = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + timedelta(days=2)
        return self

    async def close(self) -> None:
        for ch in (*self._channels, self._booking_ch, self._codepool_ch):
            await ch.close()
        await self.stack.stop()
        for p in self.db.values():
            await p.close()

    # -- catalogue --------------------------------------------------------------------------------
    async def new_slots(self, n: int, price: int = 75000) -> list[str]:
        """n back-to-back one-hour slots on the chair, at times no earlier call used."""
        slots = []
        for _ in range(n):
            start = self._base + timedelta(hours=next(self._slot_hours))
            slots.append(bpb.SlotInput(resource_id=self.resource_id, start_time=to_timestamp(start),
                                       end_time=to_timestamp(start + timedelta(hours=1)),
                                       price=common_pb2.Money(currency_code="TRY", amount_minor=price)))
        out = await self.booking.BatchCreateSlots(bpb.BatchCreateSlotsRequest(salon_id=self.salon_id, slots=slots),
                                                  metadata=ADMIN)
        return [s.id for s in out.slots]

    async def new_product(self, stock: int, price: int = 2500) -> str:
        p = await self.codepool.CreateProduct(cpb.CreateProductRequest(
            sku=f"e2e-{secrets.token_hex(6)}", name="Gift card",
            price=common_pb2.Money(currency_code="TRY", amount_minor=price)), metadata=ADMIN)
        if stock:
            await self.codepool.ImportCodeBatch(cpb.ImportCodeBatchRequest(
                product_id=p.id, batch_ref=f"b-{secrets.token_hex(4)}",
                codes=[f"CODE-{secrets.token_hex(8).upper()}" for _ in range(stock)]), metadata=ADMIN)
        return p.id

    # -- the API ----------------------------------------------------------------------------------
    def api(self, replica: int = 0) -> checkout_pb2_grpc.CheckoutServiceStub:
        return checkout_pb2_grpc.CheckoutServiceStub(self._channels[replica])

    async def create(self, customer: str, *, slot: str = "", product: str = "", quantity: int = 0,
                     key: str | None = None, replica: int = 0, pay_with: str | None = None) -> pb.Checkout:
        """CreateCheckout; with `pay_with`, a one-call checkout paid with that method."""
        req = pb.CreateCheckoutRequest(slot_id=slot, product_id=product, quantity=quantity)
        if pay_with is not None:
            req.payment_method = pay_with
        return await self.api(replica).CreateCheckout(req, metadata=md(customer, key or str(uuid.uuid4())), timeout=10)

    async def pay(self, customer: str, checkout_id: str, method: str, *, key: str | None = None,
                  replica: int = 0, timeout: float = 10) -> pb.Checkout:
        return await self.api(replica).PayCheckout(
            pb.PayCheckoutRequest(checkout_id=checkout_id, payment_method=method),
            metadata=md(customer, key or str(uuid.uuid4())), timeout=timeout)

    async def get(self, checkout_id: str, customer: str | None = None, replica: int = 0) -> pb.Checkout:
        return await self.api(replica).GetCheckout(pb.GetCheckoutRequest(checkout_id=checkout_id),
                                                   metadata=md(customer) if customer else STAFF, timeout=5)

    async def cancel(self, customer: str, checkout_id: str, replica: int = 0) -> pb.Checkout:
        return await self.api(replica).CancelCheckout(pb.CancelCheckoutRequest(checkout_id=checkout_id),
                                                      metadata=md(customer), timeout=10)

    async def reschedule(self, who: str, checkout_id: str, slot: str, *, method: str = "", key: str | None = None,
                         role: str = "customer", replica: int = 0) -> pb.Checkout:
        """RescheduleCheckout as `who` (a customer, or staff of the test merchant)."""
        return await self.api(replica).RescheduleCheckout(
            pb.RescheduleCheckoutRequest(checkout_id=checkout_id, slot_id=slot, payment_method=method),
            metadata=md(who, key or str(uuid.uuid4()), role), timeout=10)

    async def check_reschedules(self, checkout_ids: list[str]) -> dict[str, dict]:
        """The reschedule oracle over finished checkouts that were rescheduled (or tried to be):
        never both lost, never both kept: the customer holds exactly one confirmed booking, the
        checkout's, on its slot, and nothing else live; money consistent: what the PSP kept of all
        the checkout's payments (charges minus refunds) is the booked slot's price, and each payment
        attempt was charged once. Returns {checkout id: row}."""
        ledger = await self.ledger()
        assert all(n == 1 for n in ledger["charge_count_by_key"].values()), ledger["charge_count_by_key"]
        out = {}
        for cid in checkout_ids:
            r = await self.db["payments"].fetchrow("SELECT * FROM checkouts WHERE id = $1", uuid.UUID(cid))
            assert r["state"] == "COMPLETED", (cid, r["state"])
            holds = await self.db["booking"].fetch(
                "SELECT id::text, slot_id::text, status FROM holds WHERE customer_id = $1 AND (status = 'confirmed' "
                "OR (status = 'held' AND expires_at > clock_timestamp()))", r["customer_id"])
            assert [(h["id"], h["slot_id"], h["status"]) for h in holds] == [
                (r["hold_id"], str(r["slot_id"]), "confirmed")], (cid, [dict(h) for h in holds])
            intents = {x["psp_intent_id"] for x in await self.db["payments"].fetch(
                "SELECT psp_intent_id FROM payments WHERE checkout_id = $1", uuid.UUID(cid))}
            kept = sum(c["amount"] for c in ledger["charges"] if c["intent_id"] in intents) - sum(
                x["amount"] for x in ledger["refunds"] if x["intent_id"] in intents and x["status"] == "succeeded")
            assert kept == r["amount_minor"], (cid, "kept at the PSP", kept, "price", r["amount_minor"])
            out[cid] = r
        return out

    async def until(self, checkout_id: str, states=TERMINAL, timeout: float = 20, replica: int = 0) -> pb.Checkout:
        """Poll (as an internal caller) until the checkout is in one of `states`."""
        async def reached():
            try:
                c = await self.get(checkout_id, replica=replica)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:  # an orchestrator being restarted
                    return None
                raise
            return c if c.state in states else None
        return await wait_for(reached, timeout=timeout, interval=0.05,
                              message=f"checkout {checkout_id} in {[name(s) for s in states]}")

    # -- the other side of the story ---------------------------------------------------------------
    async def hold_status(self, hold_id: str) -> str:
        return await self.db["booking"].fetchval("SELECT CASE WHEN status = 'held' AND expires_at <= "
                                                 "clock_timestamp() THEN 'expired' ELSE status END "
                                                 "FROM holds WHERE id = $1", uuid.UUID(hold_id))

    async def order_status(self, order_id: str) -> str | None:
        return await self.db["codepool"].fetchval("SELECT status FROM reservations WHERE order_id = $1", order_id)

    async def code_statuses(self, order_id: str) -> list[str]:
        rows = await self.db["codepool"].fetch(
            "SELECT c.status FROM deliveries d JOIN codes c ON c.id = d.code_id "
            "WHERE d.order_id = $1 AND d.status IN ('reserved', 'delivered')", order_id)
        return sorted(r["status"] for r in rows)

    async def ledger(self) -> dict:
        return await self.stack.psp_ledger()

    async def psp(self, method: str, url: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as c:
            return await c.request(method, url)

    async def psp_faults(self, **faults: int) -> None:
        async with httpx.AsyncClient(timeout=5) as c:
            r = await c.post(f"{self.stack.psp_url}/v1/_faults", json=faults)
            r.raise_for_status()

    # -- the oracle -------------------------------------------------------------------------------
    async def check_outbox(self) -> int:
        """Over every checkout of the database: no state change without its event
        and no event without its state change. A COMPLETED checkout has exactly one
        checkout.completed and one booking.confirmed / codes.delivered, a REFUNDED one exactly one
        checkout.refunded, any other none; every event is about a checkout in the state it
        announces, of its merchant. Returns how many events were checked."""
        def completed(kind):
            return {"checkout.completed": 1, "booking.confirmed" if kind == "booking" else "codes.delivered": 1}
        # A rescheduled booking has one booking.rescheduled per reschedule that
        # succeeded (`reschedules`), whatever state it is in now; one under way has its COMPLETED events.
        want = {"COMPLETED": completed, "RESCHEDULING": completed, "RESCHEDULE_CONFIRMING": completed,
                "RESCHEDULE_REVERTING": completed,
                "REFUNDED": lambda kind: {"checkout.refunded": 1},
                # a completed booking cancelled after purchase keeps its COMPLETED events (while it
                # cancels too), and has booking.cancelled once it is cancelled
                "CANCELLING": completed,
                "CANCELLED_AFTER_PURCHASE": lambda kind: {**completed(kind), "booking.cancelled": 1}}
        rows = await self.db["payments"].fetch(
            "SELECT c.id, c.state, c.kind, c.reschedules, "
            "       COALESCE(jsonb_object_agg(e.type, e.n) FILTER (WHERE e.type IS NOT NULL), '{}') AS events "
            "FROM checkouts c LEFT JOIN (SELECT checkout_id, type, count(*) AS n FROM merchant_events "
            "                            GROUP BY checkout_id, type) e ON e.checkout_id = c.id "
            "GROUP BY c.id, c.state, c.kind, c.reschedules")
        for r in rows:
            events = r["events"] if isinstance(r["events"], dict) else json.loads(r["events"])
            expected = want[r["state"]](r["kind"]) if r["state"] in want else {}
            if r["reschedules"]:
                expected = {**expected, "booking.rescheduled": r["reschedules"]}
            assert events == expected, (str(r["id"]), r["state"], events)
        orphans = await self.db["payments"].fetch(
            "SELECT e.id, e.type, c.state FROM merchant_events e LEFT JOIN checkouts c "
            "ON c.id = e.checkout_id AND c.merchant_id = e.merchant_id "
            # stock.low is the code pool's (relayed), about a product, never a checkout's
            "WHERE CASE WHEN e.type = 'stock.low' THEN e.checkout_id IS NOT NULL ELSE "
            "c.id IS NULL OR NOT (c.state = ANY (CASE e.type WHEN 'checkout.refunded' THEN ARRAY['REFUNDED'] "
            "    WHEN 'booking.cancelled' THEN ARRAY['CANCELLED_AFTER_PURCHASE'] "
            "    ELSE ARRAY['COMPLETED', 'CANCELLING', 'CANCELLED_AFTER_PURCHASE', 'RESCHEDULING', "
            "               'RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING'] END)) END")
        assert not orphans, [dict(o) for o in orphans]
        return await self.db["payments"].fetchval("SELECT count(*) FROM merchant_events")

    async def check_invariants(self, checkout_ids: list[str]) -> dict[str, str]:
        """Invariants 4-6 (docs/architecture.md) over these checkouts, checked on the databases and the PSP:
        every captured payment is exactly one completed checkout or one refund; a finished saga holds
        nothing; the PSP charged each attempt at most once; no terminal answer carries a secret.
        Returns {checkout id: final state name}."""
        ledger = await self.ledger()
        charged = ledger["charge_count_by_key"]
        refunded_intents = {r["intent_id"] for r in ledger["refunds"]}
        assert all(n == 1 for n in charged.values()), f"a payment attempt was charged twice: {charged}"
        rows = await self.db["payments"].fetch(
            "SELECT c.*, p.status AS pstatus, p.psp_intent_id, p.idempotency_key FROM checkouts c "
            "LEFT JOIN payments p ON p.checkout_id = c.id WHERE c.id = ANY($1::uuid[])", checkout_ids)
        assert len(rows) == len(checkout_ids), "a checkout row is missing (or has two payments)"
        out = {}
        for r in rows:
            cid, st = str(r["id"]), r["state"]
            out[cid] = st
            key = r["idempotency_key"]
            captured = key is not None and charged.get(key, 0) > 0
            refunded = r["psp_intent_id"] in refunded_intents
            assert captured == (st in ("COMPLETED", "REFUNDED", "CANCELLED_AFTER_PURCHASE")), (
                cid, st, "captured" if captured else "not captured")
            # A booking cancelled after purchase is refunded what its cancel decided (if anything).
            assert refunded == (st == "REFUNDED" or (st == "CANCELLED_AFTER_PURCHASE" and r["refund_amount_minor"] > 0)), (
                cid, st, refunded)
            if st == "CANCELLED_AFTER_PURCHASE":
                back = sum(x["amount"] for x in ledger["refunds"] if x["intent_id"] == r["psp_intent_id"])
                assert back == r["refund_amount_minor"], (cid, "refunded at the PSP", back, r["refund_amount_minor"])
            view = await self.get(cid)
            assert name(view.state) == st
            if st in ("COMPLETED", "REFUNDED", "FAILED", "EXPIRED", "CANCELLED", "CANCELLED_AFTER_PURCHASE"):
                assert not view.payment.client_secret and not view.payment.next_action.redirect_url
            if r["kind"] == "booking" and r["hold_id"]:
                hold = await self.hold_status(r["hold_id"])
                assert (hold == "confirmed") == (st == "COMPLETED"), (cid, st, hold)
                if st != "COMPLETED":
                    assert hold in ("released", "expired"), (cid, st, hold)
            if r["kind"] == "codes" and st not in ("REJECTED",):
                order = await self.order_status(cid)
                codes = await self.code_statuses(cid)
                if st == "COMPLETED":
                    assert order == "delivered" and codes == ["delivered"] * r["quantity"], (cid, order, codes)
                else:
                    assert order in ("released", None) and codes == [], (cid, st, order, codes)
        return out


RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED)


async def persist(call, *, timeout: float = 90, what: str = "a definitive answer", tolerate=()):
    """A client that keeps retrying through orchestrator crashes: UNAVAILABLE / DEADLINE_EXCEEDED
    (the process died or restarts) and ABORTED (the first attempt with this key is in flight) are
    retried, with the same Idempotency-Key, until any other answer. An error whose code is in
    `tolerate` is returned as the answer instead of raised."""
    async def attempt():
        try:
            return await call()
        except grpc.aio.AioRpcError as e:
            if e.code() in RETRY_CODES:
                return None
            if e.code() in tolerate:
                return e
            raise
    return await wait_for(attempt, timeout=timeout, interval=0.1, message=what)


# Short thresholds so recovery, reconciliation and expiry take seconds, not minutes.
BASE_ENV = {
    "CUTY_LEASE_SECONDS": 2,
    "CUTY_SAGA_POLL_SECONDS": 0.2,
    "CUTY_SAGA_RETRY_BASE_SECONDS": 0.05,
    "CUTY_SAGA_RETRY_CAP_SECONDS": 1,
    "CUTY_RECONCILE_AFTER_SECONDS": 0.5,
    "CUTY_PAYMENTS_POLL_SECONDS": 0.1,
    "CUTY_PSP_TIMEOUT_SECONDS": 0.5,
    "CUTY_PSP_SYNC_TIMEOUT_DELAY_SECONDS": 1.0,
    "CUTY_PSP_WEBHOOK_RETRY_BASE_SECONDS": 0.05,
    "CUTY_PSP_WEBHOOK_RETRY_CAP_SECONDS": 0.5,
    "CUTY_PSP_SETTLE_DELAY_MS": 100,
    "CUTY_SWEEP_INTERVAL_SECONDS": 1,
    "CUTY_MAX_ACTIVE_HOLDS": 100,
    "CUTY_LOG_LEVEL": "INFO",
}


# Ports are picked free (bind to 0, then let go) and another process on a busy shared machine may
# take one before our process binds it: a stack that could not start for that is started again.
PORT_TAKEN = "Address already in use"


async def start_stack(pg, workdir, *, replicas: int = 1, gateway: bool = False, pki=None,
                      service_env: dict[str, dict] | None = None, **env) -> CheckoutStack:
    """`gateway`: also run the HTTP gateway (`stack.gateway_url`; the PSP's webhooks then go through it).
    `pki`: the stack's development PKI (default: the session's). `service_env`: one process's own
    settings (by process name, e.g. `payments-0`)."""
    for attempt in range(3):
        suffix = uuid.uuid4().hex[:8]
        dbs = {svc: with_database(pg.dsn, f"cuty_{svc}_co_{suffix}") for svc in ("booking", "codepool", "payments")}
        full = {**BASE_ENV, **{f"CUTY_{svc.upper()}_DATABASE_URL": dsn for svc, dsn in dbs.items()}, **env}
        stack = Stack(pg.dsn, workdir, payments_replicas=replicas, env=full, gateway=gateway, pki=pki,
                      service_env=service_env)
        try:
            await stack.start()
            break
        except BaseException as exc:
            await stack.stop()
            if attempt == 2 or PORT_TAKEN not in str(exc):
                raise
    pools = {svc: await asyncpg.create_pool(dsn, min_size=1, max_size=4) for svc, dsn in dbs.items()}
    return await CheckoutStack(stack, pools).open()


async def crash_at_each_point(shop: "CheckoutStack", matrix, proc_name: str = "payments-0",
                              timeout: float = 90) -> list:
    """The crash matrices' loop: for each (crash point, scenario), restart `proc_name` armed to
    SIGKILL itself at that point, start the scenario, and wait for the crash (checked in its log);
    then restart it unarmed. Returns the scenarios' results, in the matrix's order."""
    stack = shop.stack
    scenarios: list[asyncio.Task] = []
    for point, scenario in matrix:
        stack.procs[proc_name].env["CUTY_CRASH_AT"] = point
        try:
            await stack.restart(proc_name)
        except RuntimeError:
            pass  # killed at `point` while finishing an earlier scenario, before it was healthy
        proc = stack.procs[proc_name]
        scenarios.append(asyncio.create_task(scenario(shop), name=point))
        await wait_for(lambda: proc.proc.poll() is not None, timeout=timeout, message=f"the crash at {point}")
        assert proc.proc.returncode == -9, (point, proc.proc.returncode)
        assert f'"crash_point": "{point}"' in proc.tail(20000), f"died, but not at {point}"
    stack.procs[proc_name].env.pop("CUTY_CRASH_AT")
    await stack.restart(proc_name)
    return list(await asyncio.gather(*scenarios))
