"""cuty-client against a real gRPC server over mutual TLS (the platform's own bootstrap,
cutylib.grpc_server, its Trust and error mapping): retries reuse the idempotency key, deadlines
hold per call, and errors arrive typed from the services' real status details."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from cutylib import errors, principal
from cutylib.config import DEV_JWT_SECRET
from cutylib.tokens import issue
from cutylib.grpc_server import GrpcServer
from cutylib.testing.trust import dev_pki
from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cuty.payments.v1 import checkout_pb2, checkout_pb2_grpc
from payments.checkout.grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES

import cuty_client
from cuty_client import CutyClient, Retry, Tls

SLOT_TAKEN, OTHER = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"
FLAKY, SOLD_OUT = "00000000-0000-4000-8000-00000000000c", "00000000-0000-4000-8000-00000000000d"
SLOW = "00000000-0000-4000-8000-00000000000e"
SERVICE = checkout_pb2.DESCRIPTOR.services_by_name["CheckoutService"]


class Probe(checkout_pb2_grpc.CheckoutServiceServicer):
    """Fails the way the real services do, and records what each try carried."""

    def __init__(self):
        self.keys: list[str] = []
        self.tries: dict[str, int] = {}

    async def CreateCheckout(self, request, context):
        key = principal.metadata_value(context.invocation_metadata(), "idempotency-key")
        self.keys.append(key)
        target = request.slot_id or request.product_id
        self.tries[target] = self.tries.get(target, 0) + 1
        if target == FLAKY and self.tries[target] < 3:
            raise errors.Unavailable("database unavailable; retry")
        if target == SLOT_TAKEN:
            raise errors.AlreadyExists("the slot is taken", reason="slot-unavailable", detail=booking_pb2.SlotUnavailable(
                slot_id=SLOT_TAKEN, alternatives=[booking_pb2.Slot(id=OTHER)],
                held_alternative=booking_pb2.Hold(id="h-1", slot_id=OTHER)))
        if target == SOLD_OUT:
            raise errors.ResourceExhausted("out of stock", reason="out-of-stock",
                                           detail=codepool_pb2.OutOfStock(product_id=SOLD_OUT, requested=3, available=1))
        who = principal.current()
        return checkout_pb2.Checkout(id=key, failure_reason=f"{who.role}:{who.subject}")

    async def GetCheckout(self, request, context):
        self.tries[request.checkout_id] = self.tries.get(request.checkout_id, 0) + 1
        if request.checkout_id == SLOW:
            await asyncio.sleep(3)
        raise errors.NotFound(f"checkout {request.checkout_id} not found", field="checkout_id")

    async def WatchCheckout(self, request, context):
        yield checkout_pb2.CheckoutEvent(id=1)

    async def CancelCheckout(self, request, context):
        self.tries[request.checkout_id] = self.tries.get(request.checkout_id, 0) + 1
        raise errors.Unavailable("database unavailable; retry")


@pytest.fixture
async def served(monkeypatch):
    monkeypatch.setenv("CUTY_INTERNAL_CLIENTS", json.dumps(
        {"clients": [{"identity": "pos", "acts_as": {"role": "customer", "subject": "till"}, "users": ["customer"]}]}))
    probe = Probe()
    server = GrpcServer("payments", 0, host="127.0.0.1")
    checkout_pb2_grpc.add_CheckoutServiceServicer_to_server(probe, server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    await server.start()
    pki = dev_pki()
    paths = pki.paths("pos")
    cuty = CutyClient(Tls(ca=paths.ca[0], cert=paths.cert, key=paths.key), payments=f"127.0.0.1:{server.port}",
                      deadline=5, retry=Retry(attempts=3, base_seconds=0.01, cap_seconds=0.05))
    yield probe, cuty
    await cuty.close()
    await server.stop()


async def test_a_retried_call_reuses_its_idempotency_key(served):
    probe, cuty = served
    answer = await cuty.create_checkout(slot_id=FLAKY, payment_method="pm_card_ok")
    assert probe.tries[FLAKY] == 3 and len(set(probe.keys)) == 1 and answer.id == probe.keys[0]
    assert answer.failure_reason == "customer:till"  # the client acted as itself, as configured
    # A key given by the caller is the one sent; a new call without one gets a new key.
    await cuty.create_checkout(slot_id=OTHER, idempotency_key="till-sale-42")
    await cuty.create_checkout(slot_id=OTHER)
    assert probe.keys[-2] == "till-sale-42" and probe.keys[-1] not in probe.keys[:-1]


async def test_retries_are_bounded_and_a_write_without_a_key_is_tried_once(served):
    probe, cuty = served
    with pytest.raises(cuty_client.Unavailable) as e:
        await cuty.cancel_checkout(FLAKY)
    assert probe.tries[FLAKY] == 1 and e.value.retryable and e.value.problem()["status"] == 503


async def test_deadline_per_call_default_and_override(served):
    probe, cuty = served
    started = time.monotonic()
    with pytest.raises(cuty_client.DeadlineExceeded):
        await cuty.get_checkout(SLOW, deadline=0.3)
    took = time.monotonic() - started
    assert probe.tries[SLOW] == 3 and 0.85 <= took < 2.5  # three tries of 0.3 s each, not the default 5 s


async def test_typed_errors_from_the_services_details(served):
    _, cuty = served
    with pytest.raises(cuty_client.SlotTaken) as e:
        await cuty.create_checkout(slot_id=SLOT_TAKEN, payment_method="pm_card_ok")
    assert [a.id for a in e.value.alternatives] == [OTHER] and e.value.held_offer.slot_id == OTHER
    assert e.value.reason == "slot-unavailable" and e.value.problem()["status"] == 409
    with pytest.raises(cuty_client.OutOfStock) as e:
        await cuty.create_checkout(product_id=SOLD_OUT, quantity=3)
    assert (e.value.requested, e.value.available) == (3, 1)
    with pytest.raises(cuty_client.InvalidArgument) as e:  # the contract, checked by the server
        await cuty.create_checkout(slot_id="not-a-uuid")
    assert [v.field for v in e.value.violations] == ["slot_id"]
    assert e.value.problem()["errors"][0]["field"] == "slot_id"
    with pytest.raises(cuty_client.NotFound):
        await cuty.get_checkout(OTHER)
    with pytest.raises(cuty_client.PermissionDenied):  # RetryCheckout is for admins and the operator
        await cuty.call("payments", checkout_pb2_grpc.CheckoutServiceStub, "RetryCheckout",
                        checkout_pb2.RetryCheckoutRequest(checkout_id=OTHER))


async def test_a_stream_for_a_user_ends_when_their_token_does(served):
    _, cuty = served
    alice = cuty.for_user(issue(DEV_JWT_SECRET, "alice", "customer", ttl_seconds=60))
    assert [e.id async for e in alice.watch_checkout(OTHER, deadline=30)] == [1]
    with pytest.raises(cuty_client.Unauthenticated) as e:
        [e async for e in alice.watch_checkout(OTHER, deadline=600)]
    assert "token's remaining life" in e.value.message
    # The client acting as itself has no token to outlive.
    assert [e.id async for e in cuty.watch_checkout(OTHER, deadline=600)] == [1]
