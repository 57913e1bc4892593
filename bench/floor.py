"""The orchestrator's floor (`make bench-floor`): what the calls a checkout makes cost by themselves.

A checkout costs the orchestrator (payments) the calls it must make: 3 inbound gRPC calls
(CreateCheckout, PayCheckout, the PSP's webhook relayed by the gateway), 2 outbound (booking's
HoldSlot and ConfirmHold), 1 HTTP call to the PSP and 9 statements (docs/checkout.md). This
benchmark runs a stand-in orchestrator that makes exactly those calls and nothing else: the same
GrpcServer (mutual TLS, the trust, metrics and tracing interceptors, uvloop), the same client
channel, the same PSP client, the same asyncpg pool, statements of the same shape (a row written
and returned) against the same Postgres, and no saga, idempotency, view or event code. Its CPU per
checkout, read from /proc, is the floor under the real orchestrator's on this machine with this
stack; `make bench-checkout` run in the same session gives the real one. A second stand-in makes
the same calls without the statements (each answers a made-up row at once), so the difference is
what the 9 statements cost the orchestrator; the two alternate, round after round.

Processes: the stand-in orchestrator (measured), a peer that answers as booking (gRPC) and as the
PSP (HTTP) with canned answers, and the load generator (this process) acting as the gateway with a
new signed customer per checkout, as bench/checkout.py does. BENCH_SECONDS (default 8),
BENCH_CONCURRENCY (default 16), BENCH_ROUNDS (default 3).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import uuid
from datetime import datetime, timedelta, timezone

from _common import bench_postgres, closed_loop, in_turns, report

SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16").split(",")[0])
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
# As bench/checkout.py runs the stack: warnings only, 1 % of traces sampled.
ENV = {"CUTY_LOG_LEVEL": "WARNING", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
       "OTEL_TRACES_SAMPLER_ARG": "0.01", "CUTY_DB_POOL_MAX": "40"}

SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_checkouts (
    id uuid PRIMARY KEY, customer_id text NOT NULL, state text NOT NULL, hold_id text, payment_id uuid,
    amount_minor bigint, currency text, answer bytea, lease_owner text, updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS floor_payments (
    id uuid PRIMARY KEY, checkout_id uuid NOT NULL, status text NOT NULL, psp_intent_id text,
    amount_minor bigint NOT NULL, version int NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS floor_events (id text PRIMARY KEY, payload bytea NOT NULL);
"""
INSERT_CHECKOUT = ("INSERT INTO floor_checkouts (id, customer_id, state, lease_owner) VALUES ($1, $2, 'PENDING', $3) "
                   "RETURNING *")
MOVE = "UPDATE floor_checkouts SET state = $2, updated_at = now() WHERE id = $1 RETURNING *"
HELD = ("UPDATE floor_checkouts SET state = 'HELD', hold_id = $2, amount_minor = $3, currency = $4, "
        "updated_at = now() WHERE id = $1 RETURNING *")
FINISH = "UPDATE floor_checkouts SET answer = $2, lease_owner = NULL WHERE id = $1"
INSERT_PAYMENT = ("INSERT INTO floor_payments (id, checkout_id, status, amount_minor) VALUES ($1, $2, 'created', $3) "
                  "RETURNING *")
PAID = ("UPDATE floor_payments SET status = $2, psp_intent_id = $3, version = version + 1 WHERE id = $1 "
        "AND version = $4 RETURNING *")
EVENT = "INSERT INTO floor_events (id, payload) VALUES ($1, $2) ON CONFLICT DO NOTHING"


# -- the peer: booking's HoldSlot / ConfirmHold and the PSP's create-intent, canned --------------
async def peer(grpc_port: int, http_port: int) -> None:
    from aiohttp import web

    from booking.grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES
    from cuty.booking.v1 import booking_pb2 as bpb, booking_pb2_grpc
    from cuty.common.v1 import common_pb2
    from cutylib.grpc_server import GrpcServer
    from cutylib.timestamps import to_timestamp

    class Booking(booking_pb2_grpc.BookingServiceServicer):
        async def HoldSlot(self, request, context):
            now = datetime.now(timezone.utc)
            return bpb.Hold(id=str(uuid.uuid4()), slot_id=request.slot_id, customer_id=request.customer_id,
                            status=bpb.HOLD_STATUS_HELD, expire_time=to_timestamp(now + timedelta(minutes=5)),
                            start_time=to_timestamp(now + timedelta(days=2)),
                            end_time=to_timestamp(now + timedelta(days=2, minutes=30)),
                            price=common_pb2.Money(amount_minor=2500, currency_code="EUR"))

        async def ConfirmHold(self, request, context):
            return bpb.Hold(id=request.hold_id, status=bpb.HOLD_STATUS_CONFIRMED, payment_ref=request.payment_ref)

    server = GrpcServer("booking", grpc_port, host="127.0.0.1")
    booking_pb2_grpc.add_BookingServiceServicer_to_server(Booking(), server.server)
    server.add_service(bpb.DESCRIPTOR.services_by_name["BookingService"], CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    await server.start()

    async def intent(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"id": f"pi_{uuid.uuid4().hex}", "object": "payment_intent", "status": "succeeded",
                                  "amount": body.get("amount"), "currency": body.get("currency"),
                                  "amount_received": body.get("amount"), "metadata": body.get("metadata", {})})

    app = web.Application()
    app.router.add_post("/v1/payment_intents", intent)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", http_port).start()
    await asyncio.Event().wait()


# -- the stand-in orchestrator: the calls of a checkout, nothing else -----------------------------
class NoStatements:
    """The variant without the database: each statement answers a made-up row at once."""

    async def fetchrow(self, sql: str, *args):
        # a hold id the peer's ConfirmHold accepts (its request's rules say a UUID)
        return {"id": args[0], "hold_id": "00000000-0000-4000-8000-000000000001", "amount_minor": 2500,
                "currency": "EUR", "version": 1}

    async def execute(self, sql: str, *args) -> str:
        return "OK"


async def floor(port: int, dsn: str, booking_addr: str, psp_url: str, statements: bool = True) -> None:
    import asyncpg

    from cuty.booking.v1 import booking_pb2 as bpb, booking_pb2_grpc
    from cuty.payments.v1 import checkout_pb2 as cpb, checkout_pb2_grpc, payments_pb2 as ppb, payments_pb2_grpc
    from cutylib import principal
    from cutylib.grpc_client import create_channel
    from cutylib.grpc_server import GrpcServer
    from cutylib.tls import Transport
    from payments.checkout.grpc_api import CALLERS as CHECKOUT_CALLERS, SYSTEM_RPCS as CHECKOUT_SYSTEM, \
        USER_ROLES as CHECKOUT_ROLES
    from payments.grpc_api import CALLERS as PAYMENT_CALLERS, SYSTEM_RPCS as PAYMENT_SYSTEM, USER_ROLES as PAYMENT_ROLES
    from payments.psp import PspClient

    pool = await asyncpg.create_pool(dsn, min_size=4, max_size=40) if statements else NoStatements()
    booking = booking_pb2_grpc.BookingServiceStub(create_channel(booking_addr, "booking", Transport.from_env("payments")))
    psp = PspClient(psp_url)

    class Checkouts(checkout_pb2_grpc.CheckoutServiceServicer):
        async def CreateCheckout(self, request, context):
            customer = principal.current().require_subject()
            checkout_id, owner = uuid.uuid4(), f"create:{uuid.uuid4().hex[:16]}"
            await pool.fetchrow(INSERT_CHECKOUT, checkout_id, customer, owner)                # 1
            with principal.acting_as(principal.SYSTEM):  # as the saga calls booking (checkout/remote.py)
                hold = await booking.HoldSlot(bpb.HoldSlotRequest(
                    slot_id=request.slot_id, customer_id=customer, request_id=f"{checkout_id}:hold"))
            row = await pool.fetchrow(HELD, checkout_id, hold.id, hold.price.amount_minor, hold.price.currency_code)  # 2
            answer = cpb.Checkout(id=str(checkout_id), state=cpb.CHECKOUT_STATE_HELD, hold_id=row["hold_id"],
                                  slot_id=request.slot_id, expire_time=hold.expire_time, amount=hold.price)
            await pool.execute(FINISH, checkout_id, answer.SerializeToString())               # 3
            return answer

        async def PayCheckout(self, request, context):
            principal.current().require_subject()
            checkout_id = uuid.UUID(request.checkout_id)
            row = await pool.fetchrow(MOVE, checkout_id, "CHARGING")                            # 4
            payment = await pool.fetchrow(INSERT_PAYMENT, uuid.uuid4(), checkout_id, row["amount_minor"])  # 5
            intent = await psp.create_intent(f"{checkout_id}:payment", {
                "amount": row["amount_minor"], "currency": row["currency"], "payment_method": request.payment_method,
                "confirm": True, "metadata": {"payment_id": str(payment["id"]), "checkout_id": str(checkout_id)}})
            await pool.fetchrow(PAID, payment["id"], intent["status"], intent["id"], payment["version"])  # 6
            with principal.acting_as(principal.SYSTEM):
                await booking.ConfirmHold(bpb.ConfirmHoldRequest(hold_id=row["hold_id"], payment_ref=str(payment["id"])))
            # The synchronous capture recorded with the confirm (CHARGING -> COMPLETED).
            done = await pool.fetchrow(MOVE, checkout_id, "COMPLETED")                          # 7
            answer = cpb.Checkout(id=str(checkout_id), state=cpb.CHECKOUT_STATE_COMPLETED, hold_id=done["hold_id"])
            await pool.execute(FINISH, checkout_id, answer.SerializeToString())               # 8
            return answer

    class Payments(payments_pb2_grpc.PaymentServiceServicer):
        async def HandlePspWebhook(self, request, context):
            event = json.loads(request.payload)
            await pool.execute(EVENT, event["id"], request.payload)                             # 9
            return ppb.PspWebhookResponse()

    server = GrpcServer("payments", port, host="127.0.0.1")
    checkout_pb2_grpc.add_CheckoutServiceServicer_to_server(Checkouts(), server.server)
    payments_pb2_grpc.add_PaymentServiceServicer_to_server(Payments(), server.server)
    server.add_service(cpb.DESCRIPTOR.services_by_name["CheckoutService"], CHECKOUT_CALLERS,
                       system=CHECKOUT_SYSTEM, roles=CHECKOUT_ROLES)
    server.add_service(ppb.DESCRIPTOR.services_by_name["PaymentService"], PAYMENT_CALLERS,
                       system=PAYMENT_SYSTEM, roles=PAYMENT_ROLES)
    await server.start()
    await asyncio.Event().wait()


def _child(role: str, *args: str) -> None:
    from cutylib.service import event_loop_factory
    from cutylib.telemetry import init_telemetry

    init_telemetry("payments" if role == "floor" else "booking")
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(floor(int(args[0]), args[1], args[2], args[3], args[4] == "sql") if role == "floor"
                   else peer(int(args[0]), int(args[1])))


# -- the load: a gateway's calls, a new signed customer per checkout ------------------------------
def _buyer(api, payments):
    """One checkout as bench/checkout.py's buyers make it, then the PSP's webhook relayed."""
    from cuty.payments.v1 import checkout_pb2 as cpb, payments_pb2 as ppb
    from cutylib.testing.trust import user

    async def checkout(i: int) -> None:
        md = user(f"bench-{uuid.uuid4().hex[:12]}", "customer")
        c = await api.CreateCheckout(cpb.CreateCheckoutRequest(slot_id=str(uuid.uuid4())),
                                     metadata=(*md, ("idempotency-key", str(uuid.uuid4()))), timeout=10)
        paid = await api.PayCheckout(cpb.PayCheckoutRequest(checkout_id=c.id, payment_method="pm_card_ok"),
                                     metadata=(*md, ("idempotency-key", str(uuid.uuid4()))), timeout=10)
        assert paid.state == cpb.CHECKOUT_STATE_COMPLETED
        payload = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "type": "payment_intent.succeeded",
                              "data": {"object": {"metadata": {"checkout_id": c.id}}}}).encode()
        await payments.HandlePspWebhook(ppb.PspWebhookRequest(payload=payload), timeout=10)

    return checkout


async def main() -> None:
    import subprocess

    import asyncpg

    from cuty.payments.v1 import checkout_pb2_grpc, payments_pb2_grpc
    from cutylib.pgcluster import free_port
    from cutylib.testing.procs import base_env
    from cutylib.testing.trust import channel_as

    server = bench_postgres()
    work = tempfile.mkdtemp(prefix="cuty-bench-floor-")
    procs: list[subprocess.Popen] = []
    channels = []
    try:
        conn = await asyncpg.connect(server.dsn)
        await conn.execute(SCHEMA)
        await conn.close()
        env = base_env(**ENV)
        bport, hport = free_port(), free_port()

        def spawn(*args) -> subprocess.Popen:
            log = open(os.path.join(work, f"{args[0]}-{len(procs)}.log"), "ab")
            p = subprocess.Popen([sys.executable, __file__, *map(str, args)], env=env, stdout=log, stderr=subprocess.STDOUT)
            procs.append(p)
            return p

        spawn("peer", bport, hport)
        variants = {}  # name -> (process, checkout, what it makes)
        for name, mode, calls in (("the calls of a checkout, no saga", "sql", "3 gRPC in, 2 gRPC out, 1 HTTP, 9 statements"),
                                  ("the same without its 9 statements", "nosql", "3 gRPC in, 2 gRPC out, 1 HTTP")):
            port = free_port()
            proc = spawn("floor", port, server.dsn, f"127.0.0.1:{bport}", f"http://127.0.0.1:{hport}", mode)
            ch = channel_as("gateway", f"127.0.0.1:{port}", "payments")
            channels.append(ch)
            await ch.channel_ready()
            variants[name] = (proc, _buyer(checkout_pb2_grpc.CheckoutServiceStub(ch), payments_pb2_grpc.PaymentServiceStub(ch)),
                              calls)
        for name, (proc, checkout, _) in variants.items():
            warm = await closed_loop(checkout, concurrency=CONCURRENCY, total=200)  # connections, caches
            if warm.errors:
                await checkout(0)  # raises the error the checkouts fail with
        runs, _ = await in_turns({name: (lambda r, checkout=checkout: (checkout, None))
                                  for name, (_, checkout, _) in variants.items()},
                                 rounds=ROUNDS, concurrency=CONCURRENCY, duration=SECONDS,
                                 pids={name: proc.pid for name, (proc, _, _) in variants.items()})
        results, cpu = [], {name: [] for name in variants}
        for r in range(ROUNDS):
            for name, (_, _, calls) in variants.items():
                run = runs[name][r]
                if run.errors:
                    raise RuntimeError(f"{run.errors} checkouts failed; see {work}")
                ms = round(1000 * run.cpu_s / max(1, run.ops), 2)
                cpu[name].append(ms)
                results.append(run.result(f"{name} (round {r + 1})", CONCURRENCY, notes=calls,
                                          orchestrator_cpu_ms_per_checkout=ms))
        report("floor", results)
        print("\nthe stand-in orchestrator's CPU ms per checkout (compare payments-0 in `make bench-checkout`):")
        for name, figures in cpu.items():
            figures.sort()
            print(f"  {name:40} median {figures[len(figures) // 2]:.2f}  (rounds {figures})")
    finally:
        for ch in channels:
            await ch.close()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        server.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _child(sys.argv[1], *sys.argv[2:])
    else:
        asyncio.run(main())
