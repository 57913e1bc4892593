"""How the checkout saga plugs into the payments server (payments/bootstrap.py calls `register`):
the composition root of the saga, the one place that knows the payments core concretely and hands
it to the saga as its `ports.Payments` and `metrics.CheckoutMetrics`."""
from __future__ import annotations

from cuty.booking.v1 import booking_pb2_grpc
from cuty.codepool.v1 import codepool_pb2_grpc
from cuty.payments.v1 import checkout_pb2, checkout_pb2_grpc
from cutylib import crash
from cutylib.config import grpc_addr_for
from cutylib.grpc_client import create_channel
from cutylib.tls import BOOKING, CODEPOOL, PAYMENTS, Transport

from ..service import PaymentsCore
from . import views
from .engine import Engine
from .grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES, CheckoutApi
from .idempotency import IdempotencyStore
from .live import Watchers
from .no_show_fee import NoShowFees
from .remote import Inventory
from .service import CheckoutService
from .settings import CheckoutOptions
from .staff_service import StaffBookings
from .workers import SagaWorker

SERVICE = checkout_pb2.DESCRIPTOR.services_by_name["CheckoutService"]


def build(settings, pool, core: PaymentsCore, *, options: CheckoutOptions | None = None, booking_stub=None, codepool_stub=None,
          transport: Transport | None = None):
    """The saga's parts, with stubs given (tests: fakes) or channels to CUTY_BOOKING_ADDR /
    CUTY_CODEPOOL_ADDR. Returns (service, engine, worker, channels)."""
    options = options or CheckoutOptions()
    channels = []
    if booking_stub is None:
        transport = transport or Transport.from_env(PAYMENTS)
        ch = create_channel(grpc_addr_for("booking"), BOOKING, transport,
                            deadline_seconds=options.remote_deadline_seconds)
        channels.append(ch)
        booking_stub = booking_pb2_grpc.BookingServiceStub(ch)
    if codepool_stub is None:
        transport = transport or Transport.from_env(PAYMENTS)
        ch = create_channel(grpc_addr_for("codepool"), CODEPOOL, transport,
                            deadline_seconds=options.remote_deadline_seconds)
        channels.append(ch)
        codepool_stub = codepool_pb2_grpc.CodePoolServiceStub(ch)
    lease = float(settings.lease_seconds)
    holds = Inventory(booking_stub, codepool_stub)
    engine = Engine(pool, holds, core, core.metrics, options, lease)
    keys = IdempotencyStore(pool, lease, options.idempotency_ttl_seconds, views.stored)
    service = CheckoutService(pool, engine, holds, core, core.metrics, keys, lease, Watchers(pool, options))
    fees = NoShowFees(pool, core, f"no-show-fee:{core.worker_id}", lease_seconds=lease,
                      retry_seconds=options.retry_cap_seconds, poll_seconds=options.poll_seconds)
    service.staff = StaffBookings(service, options.link_ttl_seconds, fees)
    worker = SagaWorker(pool, engine, options, lease, f"saga:{core.worker_id}")
    return service, engine, worker, channels


def register(server, settings, pool, core: PaymentsCore) -> None:
    """Register CheckoutService and the saga workers on `server` (a cutylib GrpcServer)."""
    options = CheckoutOptions()
    crash.configure(options.crash_at)
    service, _engine, worker, channels = build(settings, pool, core, options=options, transport=server.transport)
    checkout_pb2_grpc.add_CheckoutServiceServicer_to_server(CheckoutApi(service), server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    server.add_background(worker.run)
    # No-show fees left due (their charger died, or the PSP did not answer).
    server.add_background(service.staff.fees.run)
    # One LISTEN connection per process for WatchCheckout's streams (checkout/live.py).
    server.add_background(service.watchers.run)
    # A payment's status change wakes its saga in the database (trigger payments_wake_checkout), not
    # through the core.

    async def close_channels() -> None:
        for ch in channels:
            await ch.close()

    server.on_stop(close_channels)
