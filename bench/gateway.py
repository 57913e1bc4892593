"""Gateway overhead: the same RPC through HTTP/JSON (gateway) and directly over gRPC, in one run.

Scenarios (closed loop, N concurrent clients, each its own customer):
- `GET /v1/salons/{id}/slots` (a day of a two-stylist salon: 18 slots) vs BookingService.ListSlots
- `POST /v1/checkouts` (one code) vs CheckoutService.CreateCheckout (booking + codepool behind it)

Target: the gateway adds <= 30% to p99 and keeps >= 60% of the direct throughput.

The HTTP side uses a minimal keep-alive HTTP/1.1 client (one connection per client) so that on a
small machine the figures measure the gateway, not a heavyweight client library sharing its CPU.
The gateway's own CPU per request (from /proc, over the measured run via the gateway) is
reported beside each row (`gateway_cpu_ms_per_request`).
Run: `make bench-gateway` (CUTY_BENCH_SECONDS, CUTY_BENCH_CONCURRENCY="16,64" to change).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import os
import tempfile
import time
import uuid

from _common import Http, bench_postgres, closed_loop, contract_check_cost, cpu_seconds, report

import grpc
import jwt

from cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from cuty.codepool.v1 import codepool_pb2, codepool_pb2_grpc
from cuty.payments.v1 import checkout_pb2, checkout_pb2_grpc
from cutylib.config import DEV_JWT_SECRET
from cutylib.testing.stack import Stack
from cutylib.testing.trust import org_for, user

SECONDS = float(os.environ.get("CUTY_BENCH_SECONDS", "8"))
CONCURRENCY = [int(c) for c in os.environ.get("CUTY_BENCH_CONCURRENCY", "16,64").split(",")]
CODES = int(os.environ.get("CUTY_BENCH_CODES", "60000"))
ADMIN = user("bench-admin", "admin")


def customer(i: int) -> tuple[tuple[str, str], ...]:
    return user(f"bench-customer-{i}", "customer")


def token(sub: str, role: str) -> str:
    claims = {"sub": sub, "role": role, "exp": int(time.time()) + 3600}
    if org := org_for(role):
        claims["org"] = org
    return jwt.encode(claims, DEV_JWT_SECRET, algorithm="HS256")


async def seed(stack: Stack) -> tuple[str, dict, str]:
    async with stack.channel("gateway", "booking") as ch, stack.channel("gateway", "codepool") as cp:
        b = booking_pb2_grpc.BookingServiceStub(ch)
        salon = await b.CreateSalon(booking_pb2.CreateSalonRequest(name="Bench", time_zone="Europe/Istanbul"), metadata=ADMIN)
        day = dt.datetime.now(dt.timezone.utc).replace(hour=6, minute=0, second=0, microsecond=0) + dt.timedelta(days=2)
        for r in range(2):
            res = await b.CreateResource(booking_pb2.CreateResourceRequest(salon_id=salon.id, name=f"s{r}"), metadata=ADMIN)
            req = booking_pb2.BatchCreateSlotsRequest(salon_id=salon.id)
            for h in range(9):
                s = req.slots.add(resource_id=res.id)
                s.start_time.FromDatetime(day + dt.timedelta(hours=h))
                s.end_time.FromDatetime(day + dt.timedelta(hours=h + 1))
                s.price.currency_code, s.price.amount_minor = "TRY", 75000
            await b.BatchCreateSlots(req, metadata=ADMIN)
        window = {"start": day, "end": day + dt.timedelta(days=1)}
        c = codepool_pb2_grpc.CodePoolServiceStub(cp)
        product = await c.CreateProduct(codepool_pb2.CreateProductRequest(sku=f"BENCH-{uuid.uuid4().hex[:8]}", name="Bench",
                                        price={"currency_code": "TRY", "amount_minor": 1000}), metadata=ADMIN)
        for start in range(0, CODES, 10_000):
            await c.ImportCodeBatch(codepool_pb2.ImportCodeBatchRequest(
                product_id=product.id, batch_ref=f"b{start}",
                codes=[f"BENCH-{uuid.uuid4().hex}" for _ in range(min(10_000, CODES - start))]), metadata=ADMIN, timeout=300)
    return salon.id, window, product.id


async def main() -> None:
    pg = bench_postgres()
    work = tempfile.mkdtemp(prefix="cuty-bench-gateway-")
    # The rate limits (per client address, per subject) and the admission control stay on but are
    # set out of the way (every client shares one address; the concurrency limit pinned above the
    # clients in flight): this measures the path, not the shedding.
    stack = Stack(pg.dsn, work, gateway=True, env={"CUTY_GATEWAY_RATE_PER_SECOND": 1_000_000,
                                                    "CUTY_GATEWAY_RATE_BURST": 1_000_000,
                                                    "CUTY_GATEWAY_ADDRESS_RATE_PER_SECOND": 1_000_000,
                                                    "CUTY_GATEWAY_ADDRESS_RATE_BURST": 1_000_000,
                                                    "CUTY_GATEWAY_CONCURRENCY_MIN": 1000,
                                                    "CUTY_GATEWAY_CONCURRENCY_MAX": 1000, "CUTY_LOG_LEVEL": "WARNING",
                                                    # each client buys again and again (the per-customer caps)
                                                    "CUTY_MAX_ACTIVE_RESERVATIONS": 1_000_000,
                                                    "CUTY_MAX_QUANTITY_PER_PRODUCT": 1_000_000})
    print("starting postgres, the services, the PSP simulator and the gateway ...", flush=True)
    await stack.start()
    results = []
    try:
        print(f"seeding a salon and {CODES} codes ...", flush=True)
        salon_id, window, product_id = await seed(stack)
        port = stack.http_port
        # The direct limit: the same RPCs as the gateway makes them (its certificate, long-lived channels).
        booking = stack.channel("gateway", "booking")
        payments = stack.channel("gateway", "payments")
        list_req = booking_pb2.ListSlotsRequest(salon_id=salon_id)
        list_req.start_time.FromDatetime(window["start"])
        list_req.end_time.FromDatetime(window["end"])
        query = f"/v1/salons/{salon_id}/slots?startTime={window['start'].isoformat().replace('+', '%2B')}" \
                f"&endTime={window['end'].isoformat().replace('+', '%2B')}"
        for n in CONCURRENCY:
            conns = [Http(port) for _ in range(n)]
            # `closed_loop` numbers operations, not workers: hand each op a connection no other op uses.
            free = list(conns)

            async def over_http(method, path, headers, body=b""):
                conn = free.pop()
                try:
                    return await conn.request(method, path, headers, body)
                except BaseException:
                    conn.writer = None  # a half-read answer would poison the connection
                    raise
                finally:
                    free.append(conn)
            tokens = [token(f"bench-customer-{i}", "customer") for i in range(n)]
            slots = booking_pb2_grpc.BookingServiceStub(booking)
            checkout = checkout_pb2_grpc.CheckoutServiceStub(payments)

            async def slots_direct(i):
                r = await slots.ListSlots(list_req, metadata=customer(i % n), timeout=10)
                assert len(r.slots) == 18

            async def slots_http(i):
                status, body = await over_http("GET", query, {"Authorization": f"Bearer {tokens[i % n]}"})
                assert status == 200, body

            async def checkout_direct(i):
                md = customer(i % n) + (("idempotency-key", uuid.uuid4().hex),)
                await checkout.CreateCheckout(checkout_pb2.CreateCheckoutRequest(product_id=product_id, quantity=1),
                                              metadata=md, timeout=10)

            body = ('{"productId":"%s","quantity":1}' % product_id).encode()

            async def checkout_http(i):
                status, out = await over_http("POST", "/v1/checkouts", {
                    "Authorization": f"Bearer {tokens[i % n]}", "Idempotency-Key": uuid.uuid4().hex,
                    "Content-Type": "application/json"}, body)
                assert status == 200, out

            for name, direct, via in (("GET slots", slots_direct, slots_http), ("POST checkouts", checkout_direct, checkout_http)):
                print(f"{name} at {n} in flight, {SECONDS:g} s each way ...", flush=True)
                await closed_loop(direct, concurrency=n, total=n * 5)  # warm up both paths
                await closed_loop(via, concurrency=n, total=n * 5)
                d = await closed_loop(direct, concurrency=n, duration=SECONDS)
                gateway_pid = stack.procs["gateway"].proc.pid
                cpu0 = cpu_seconds(gateway_pid)
                g = await closed_loop(via, concurrency=n, duration=SECONDS)
                gateway_cpu_ms = 1000 * (cpu_seconds(gateway_pid) - cpu0) / max(1, g.ops)
                dr = d.result(f"{name} direct gRPC", n)
                gr = g.result(f"{name} via gateway", n, limit=d)
                overhead = (gr.p99_ms / dr.p99_ms - 1) * 100 if dr.p99_ms else 0
                gr.notes = f"p99 +{overhead:.0f}% vs direct; throughput {gr.ratio_to_limit:.0%} of direct"
                gr.extra.update(p99_overhead_pct=round(overhead, 1), direct_p99_ms=dr.p99_ms,
                                gateway_cpu_ms_per_request=round(gateway_cpu_ms, 3))
                results += [dr, gr]
                if name == "POST checkouts":
                    # The gateway checks each write against its contract (transcoded, before the
                    # call): that check's cost beside the gateway's CPU per request (target <= 5 %).
                    results.append(contract_check_cost(
                        f"POST checkouts: CreateCheckoutRequest's contract check, at {n}",
                        checkout_pb2.CreateCheckoutRequest(product_id=product_id, quantity=1), gateway_cpu_ms))
            for c in conns:
                c.close()
        await booking.close()
        await payments.close()
    finally:
        await stack.stop()
        pg.close()
    report("gateway", results)


if __name__ == "__main__":
    asyncio.run(main())
