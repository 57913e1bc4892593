"""What an internal client's call costs the service (`make bench-clients`), against a gateway call
measured in the same run.

One process serves a CheckoutService whose GetCheckout answers at once (no database: what is
measured is the call's path through mutual TLS and Trust, docs/clients.md) and calls it, in
alternated rounds:
- `gateway`: with the gateway's certificate and a signed user assertion (the path every HTTP
  request takes; the reference, `limit` in the table);
- `client-itself`: a registered internal client acting as its configured user (raw stub);
- `client-for-user`: the same client forwarding a user's bearer token (verified by the service
  with the gateway's verifier, cached per token);
- `cuty-client-itself` / `cuty-client-for-user`: the same two through the cuty-client package
  (its deadline, metadata and typed-error wrapping included).
Figures: calls/s, p50/p99 and the ratio to the gateway path.

    BENCH_CALLS (2000 per round and scenario), BENCH_ROUNDS (3), BENCH_CONCURRENCY (16)
"""
from __future__ import annotations

import asyncio
import json
import os
import tempfile

from _common import closed_loop, merged, report

os.environ.setdefault("CUTY_DATA_DIR", tempfile.mkdtemp(prefix="cuty-bench-clients-"))
os.environ["CUTY_INTERNAL_CLIENTS"] = json.dumps({"clients": [
    {"identity": "pos", "acts_as": {"role": "customer", "subject": "till"}, "users": ["customer"]}]})
os.environ.setdefault("CUTY_LOG_LEVEL", "WARNING")

from cuty.payments.v1 import checkout_pb2, checkout_pb2_grpc  # noqa: E402
from cutylib.config import DEV_JWT_SECRET  # noqa: E402
from cutylib.grpc_server import GrpcServer  # noqa: E402
from cutylib.testing.trust import channel_as, dev_pki, user  # noqa: E402
from cutylib.tokens import issue  # noqa: E402
from payments.checkout.grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES  # noqa: E402

from cuty_client import CutyClient, Tls  # noqa: E402

CALLS = int(os.environ.get("BENCH_CALLS", "2000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
CHECKOUT = "00000000-0000-4000-8000-000000000001"
ANSWER = checkout_pb2.Checkout(id=CHECKOUT, state=checkout_pb2.CHECKOUT_STATE_COMPLETED)


class Probe(checkout_pb2_grpc.CheckoutServiceServicer):
    async def GetCheckout(self, request, context):
        return ANSWER


async def main() -> None:
    server = GrpcServer("payments", 0, host="127.0.0.1")
    checkout_pb2_grpc.add_CheckoutServiceServicer_to_server(Probe(), server.server)
    server.add_service(checkout_pb2.DESCRIPTOR.services_by_name["CheckoutService"], CALLERS,
                       system=SYSTEM_RPCS, roles=USER_ROLES)
    await server.start()
    addr = f"127.0.0.1:{server.port}"
    paths = dev_pki().paths("pos")
    token = issue(DEV_JWT_SECRET, "alice", "customer", ttl_seconds=3600)
    req = checkout_pb2.GetCheckoutRequest(checkout_id=CHECKOUT)
    gw_md = user("alice", "customer", service="payments")
    bearer = (("authorization", f"Bearer {token}"),)
    gateway = channel_as("gateway", addr, "payments")
    pos = channel_as("pos", addr, "payments")
    cuty = CutyClient(Tls(ca=paths.ca[0], cert=paths.cert, key=paths.key), payments=addr, deadline=10)
    as_alice = cuty.for_user(token)
    gw_stub, pos_stub = checkout_pb2_grpc.CheckoutServiceStub(gateway), checkout_pb2_grpc.CheckoutServiceStub(pos)
    scenarios = {
        "gateway": lambda i: gw_stub.GetCheckout(req, metadata=gw_md, timeout=10),
        "client-itself": lambda i: pos_stub.GetCheckout(req, timeout=10),
        "client-for-user": lambda i: pos_stub.GetCheckout(req, metadata=bearer, timeout=10),
        "cuty-client-itself": lambda i: cuty.get_checkout(CHECKOUT),
        "cuty-client-for-user": lambda i: as_alice.get_checkout(CHECKOUT),
    }
    for op in scenarios.values():  # warm: connections, caches
        await closed_loop(op, concurrency=CONCURRENCY, total=200)
    runs: dict[str, list] = {name: [] for name in scenarios}
    for _ in range(ROUNDS):
        for name, op in scenarios.items():
            runs[name].append(await closed_loop(op, concurrency=CONCURRENCY, total=CALLS))
    base = merged(runs["gateway"])
    results = [merged(r).result(name, CONCURRENCY, limit=None if name == "gateway" else base,
                                notes="reference" if name == "gateway" else "ratio to the gateway path")
               for name, r in runs.items()]
    report("clients", results)
    await cuty.close()
    await gateway.close()
    await pos.close()
    await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
