"""What a refusal for load costs the gateway (`make bench-refusal`): CPU per `503 overloaded`.

Past capacity the gateway refuses several requests for each one it admits, so a refusal must cost
almost nothing: admission is decided before the token is verified, the body read or anything
transcoded (docs/gateway.md). This calls the gateway's ASGI application directly, in process, with
its concurrency limit full, for BENCH_REFUSALS `POST /v1/checkouts` requests, each with a token
never seen before (every buyer of a flash sale is new to the verifier's cache) and a body; it
reports the process CPU per refusal and where it goes (cProfile, top functions, with BENCH_PROFILE=1).
The HTTP server's own parsing (uvicorn) is not included: it is the same for every request.
"""
from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import time
import uuid

from _common import Result, report

import jwt

from cutylib.config import DEV_JWT_SECRET
from gateway.app import Gateway
from gateway.descriptors import load_routes
from gateway.settings import GatewaySettings

N = int(os.environ.get("BENCH_REFUSALS", "5000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
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
                               concurrency_min=1, concurrency_max=1, concurrency_initial=1,
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
    report("refusal", results)


if __name__ == "__main__":
    asyncio.run(main())
