"""What a refusal for load costs the gateway (`make bench-refusal`): CPU per `503 overloaded`.

Past capacity the gateway refuses several requests for each one it admits, so a refusal must cost
almost nothing: admission is decided before the token is verified, the body read or anything
transcoded (docs/gateway.md). This calls the gateway's ASGI application directly, in process, with
its concurrency limit full, for BENCH_REFUSALS `POST /v1/checkouts` requests, each with a token
never seen before (every buyer of a flash sale is new to the verifier's cache) and a body; it
reports the process CPU per refusal and where it goes (cProfile, top functions, with BENCH_PROFILE=1).
The HTTP server's own parsing (uvicorn) is not included there. Both measure the refusal itself:
the gateway's short wait for a freed place (admission.py) is set to 0 here, since a held place
never frees and each refusal would otherwise be timed by the wait.

End to end (BENCH_E2E=1, the default): the deployed gateway process (uvicorn, the real stack) with
a concurrency limit of one, held by a call to a frozen service (SIGSTOP), refuses BENCH_E2E_REFUSALS
`POST /v1/checkouts` from BENCH_E2E_CLIENTS clients at once, in two ways side by side: every client
keeping its connection (the gateway reads a refused small body and keeps the connection open), and
every client opening a new connection per request (what each refusal cost when the gateway closed
the connection after it). It reports the gateway process's CPU per refusal (user + system, from
/proc: the HTTP parsing, the accept and the writes included), this client's, and the latency.
CPU seconds, unlike wall time, mean something on a shared machine.
"""
from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import tempfile
import time
import uuid

from _common import Http, Result, bench_postgres, cpu_seconds, percentile, report

import jwt

from cutylib.config import DEV_JWT_SECRET
from cutylib.testing.stack import Stack
from cutylib.testing.trust import TEST_MERCHANT
from gateway.app import Gateway
from gateway.descriptors import load_routes
from gateway.settings import GatewaySettings

N = int(os.environ.get("BENCH_REFUSALS", "5000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
E2E = os.environ.get("BENCH_E2E", "1") == "1"
E2E_N = int(os.environ.get("BENCH_E2E_REFUSALS", "2000"))
E2E_CLIENTS = int(os.environ.get("BENCH_E2E_CLIENTS", "8"))
HOLD_SECONDS = 8  # each way's refusals must be done within it (a few seconds at most)
BODY = b'{"productId":"7f1c3b0e-4c2a-4b8e-9a57-63757479636b","quantity":1}'


def request(token: str):
    scope = {"type": "http", "method": "POST", "path": "/v1/checkouts", "raw_path": b"/v1/checkouts",
             "query_string": b"", "client": ("203.0.113.7", 40000),
             "headers": [(b"host", b"shop"), (b"content-length", str(len(BODY)).encode()),
                         (b"authorization", b"Bearer " + token.encode()), (b"content-type", b"application/json"),
                         (b"idempotency-key", uuid.uuid4().hex.encode())]}
    return scope


async def refuse_all(app: Gateway, tokens: list[str]) -> None:
    statuses = []

    async def receive():
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    for t in tokens:
        await app(request(t), receive, send)
    assert set(statuses) == {503}, set(statuses)


async def main() -> None:
    owners = {r.owner for r in load_routes()}
    settings = GatewaySettings(port=0, host="127.0.0.1", jwt_secret=DEV_JWT_SECRET, access_log=False,
                               backends={o: "127.0.0.1:9" for o in owners},  # never called
                               concurrency_min=1, concurrency_max=1, concurrency_initial=1, queue_seconds=0.0,
                               address_rate_per_second=1e9, address_rate_burst=1e9)
    app = Gateway(settings)
    app.admission.in_flight = app.admission.cap("critical")  # full: every new checkout is refused
    exp = int(time.time()) + 3600
    results = []
    per = []
    for rnd in range(ROUNDS):
        tokens = [jwt.encode({"sub": f"buyer-{rnd}-{i}", "role": "customer", "exp": exp}, DEV_JWT_SECRET,
                             algorithm="HS256") for i in range(N)]
        verified = app.verify.verified
        t0, w0 = time.process_time(), time.perf_counter()
        await refuse_all(app, tokens)
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
        per.append(1e6 * cpu / N)
        r = Result(f"503 overloaded, new token each (round {rnd + 1})", 1, round(N / wall, 1), 0, 0, 0)
        r.extra = {"cpu_us_per_refusal": round(1e6 * cpu / N, 1), "tokens_verified": app.verify.verified - verified}
        r.notes = f"{r.extra['cpu_us_per_refusal']} us CPU each; {r.extra['tokens_verified']} tokens verified"
        results.append(r)
    print(f"median CPU per refusal: {sorted(per)[len(per) // 2]:.1f} us over {ROUNDS} rounds of {N}", flush=True)
    if os.environ.get("BENCH_PROFILE") == "1":
        prof = cProfile.Profile()
        tokens = [jwt.encode({"sub": f"p-{i}", "role": "customer", "exp": exp}, DEV_JWT_SECRET,
                             algorithm="HS256") for i in range(N)]
        prof.enable()
        await refuse_all(app, tokens)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    if E2E:
        results += await end_to_end()
    report("refusal", results)


async def end_to_end() -> list[Result]:
    pg = bench_postgres()
    stack = Stack(pg.dsn, tempfile.mkdtemp(prefix="cuty-bench-refusal-"), gateway=True, env={
        "CUTY_LOG_LEVEL": "WARNING", "CUTY_PSP_LOG_LEVEL": "WARNING", "CUTY_GATEWAY_ACCESS_LOG": "0",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01",
        "CUTY_GATEWAY_CONCURRENCY_MIN": 1, "CUTY_GATEWAY_CONCURRENCY_MAX": 1, "CUTY_GATEWAY_CONCURRENCY_INITIAL": 1,
        "CUTY_GATEWAY_QUEUE_SECONDS": 0,
        "CUTY_GATEWAY_RATE_PER_SECOND": 1_000_000, "CUTY_GATEWAY_RATE_BURST": 1_000_000,
        "CUTY_GATEWAY_ADDRESS_RATE_PER_SECOND": 1_000_000, "CUTY_GATEWAY_ADDRESS_RATE_BURST": 1_000_000})
    print("end to end: starting postgres, the services and the gateway ...", flush=True)
    await stack.start()
    results = []
    try:
        gateway_pid = stack.procs["gateway"].proc.pid
        stack.procs["booking"].pause()  # a call to booking now waits for its deadline
        exp = int(time.time()) + 3600
        tokens = [jwt.encode({"sub": f"e2e-{i}", "role": "customer", "exp": exp}, DEV_JWT_SECRET,
                             algorithm="HS256") for i in range(E2E_N)]
        admin = jwt.encode({"sub": "bench-admin", "role": "admin", "org": TEST_MERCHANT, "exp": exp}, DEV_JWT_SECRET,
                           algorithm="HS256")
        for mode in ("keep-alive", "new connection each", "keep-alive", "new connection each"):
            # The limit's one place, held for HOLD_SECONDS by a salon that booking (frozen) never
            # makes; the call ends with its deadline (504), and the next way starts after it. A
            # holder that was itself refused (the place was taken at that moment) is sent again.
            for _ in range(50):
                holder_conn = Http(stack.http_port)
                holder = asyncio.create_task(holder_conn.request("POST", "/v1/salons", {
                    "Authorization": f"Bearer {admin}", "Content-Type": "application/json",
                    "Request-Timeout": str(HOLD_SECONDS), "Idempotency-Key": uuid.uuid4().hex},
                    b'{"name":"held","timeZone":"Europe/Istanbul"}'))
                await asyncio.sleep(0.5)
                if not holder.done():  # admitted, and waiting on the frozen service
                    break
                holder_conn.close()
            lat: list[float] = []
            statuses: dict[int, int] = {}
            other: list[str] = []  # the first answer that was no refusal (the holder's place ran out)
            conns = [Http(stack.http_port) for _ in range(E2E_CLIENTS)]
            todo = iter(range(E2E_N))

            async def client(conn: Http) -> None:
                for i in todo:
                    t0 = time.perf_counter()
                    status, raw = await conn.request("POST", "/v1/checkouts", {
                        "Authorization": f"Bearer {tokens[i]}", "Content-Type": "application/json",
                        "Idempotency-Key": uuid.uuid4().hex}, BODY)
                    lat.append((time.perf_counter() - t0) * 1000)
                    statuses[status] = statuses.get(status, 0) + 1
                    if status != 503 and not other:
                        other.append(raw[:300].decode(errors="replace"))
                    if mode != "keep-alive":
                        conn.close()

            g0, c0, w0 = cpu_seconds(gateway_pid), time.process_time(), time.perf_counter()
            await asyncio.gather(*(client(c) for c in conns))
            wall = time.perf_counter() - w0
            gw, cl = cpu_seconds(gateway_pid) - g0, time.process_time() - c0
            for c in conns:
                c.close()
            held_status, held_raw = await asyncio.wait_for(holder, HOLD_SECONDS + 5)  # its place is free again
            holder_conn.close()
            lat.sort()
            r = Result(f"end to end, {mode}", E2E_CLIENTS, round(E2E_N / wall, 1), round(percentile(lat, 0.5), 2),
                       round(percentile(lat, 0.99), 2), round(lat[-1], 2))
            r.extra = {"gateway_cpu_us_per_refusal": round(1e6 * gw / E2E_N, 1),
                       "client_cpu_us_per_refusal": round(1e6 * cl / E2E_N, 1), "answers": statuses,
                       "first_other_answer": other[0] if other else None,
                       "holder_answer": f"{held_status} {held_raw[:120].decode(errors='replace')}"}
            r.notes = (f"gateway {r.extra['gateway_cpu_us_per_refusal']} us CPU per refusal, client "
                       f"{r.extra['client_cpu_us_per_refusal']} us")
            print(f"  {r.scenario}: {r.notes}; {statuses}", flush=True)
            results.append(r)
    finally:
        stack.procs["booking"].resume()
        await stack.stop()
        pg.close()
    return results


if __name__ == "__main__":
    asyncio.run(main())
