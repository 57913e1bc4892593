"""The checkout saga in process: real PostgreSQL, the real payments core and saga code, fake
booking / code pool / PSP (checkout_fakes.py).

The saga tests get a database of their own (migrated like cuty_payments), so no other suite's
in-process payments server (whose saga workers would claim any due checkout) shares their rows.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import uuid

import grpc
import pytest
import pytest_asyncio

from cuty.payments.v1 import checkout_pb2_grpc, payments_pb2, payments_pb2_grpc
from cutylib.config import Settings, with_database
from cutylib.db import migrate
from cutylib.testing.postgres import service_dsn
from payments.bootstrap import create_payments_pool
from cutylib.grpc_server import GrpcServer
from cutylib import crash
from payments.checkout import views, wiring
from payments.checkout.answers import CheckoutAnswer, CheckoutPage
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import acting_channel
from payments.checkout.grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES, CheckoutApi
from payments.checkout.wiring import SERVICE
from payments.checkout.domain import validate_create
from payments.checkout.settings import CheckoutOptions
from payments.grpc_api import CALLERS as PAYMENT_CALLERS, SYSTEM_RPCS as PAYMENT_SYSTEM_RPCS, \
    USER_ROLES as PAYMENT_USER_ROLES, PaymentApi
from payments.service import PaymentsCore
from payments.metrics import PaymentsMetrics
from payments.outbound.repository import Endpoints
from payments.outbound.service import WebhookEndpoints
from payments.settings import PaymentsOptions

from cutylib.testing.fake_psp import FakePsp
from checkout_fakes import FakeBooking, FakeCodePool

REPO_MIGRATIONS = __import__("pathlib").Path(__file__).resolve().parents[3] / "services/payments/migrations"


@pytest.fixture(scope="session")
def checkout_dsn(pg) -> str:
    """The checkout tests' database, as the superuser (the tests' own reads past Row-Level Security)."""
    return with_database(pg.dsn, "cuty_payments_checkout_it")


@pytest_asyncio.fixture(scope="session")
async def checkout_pool(pg, checkout_dsn):
    """The services' pool: payments' own database role, as in production."""
    dsn = checkout_dsn
    await migrate(dsn, REPO_MIGRATIONS)
    pool = await create_payments_pool(await service_dsn(pg.dsn, "payments", dsn),
                                      dataclasses.replace(Settings(), db_pool_min=2, db_pool_max=40))
    yield pool
    await pool.close()


class AsTheApiAnswers:
    """The checkout service with its answers turned into the protos the gRPC API sends
    (checkout/views.py), the same translation CheckoutApi makes."""

    def __init__(self, service):
        self._service = service

    def __getattr__(self, name: str):
        attr = getattr(self._service, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args, **kwargs):
            out = await attr(*args, **kwargs)
            if isinstance(out, CheckoutAnswer):
                return views.checkout_pb(out)
            if isinstance(out, CheckoutPage):
                return views.page_pb(out)
            return out
        return call


class Harness:
    """One saga world: fakes, a core, the checkout service, and workers on demand."""

    def __init__(self, pool, *, lease_seconds: float = 2.0, hold_ttl: float = 300, **options):
        self.pool = pool
        self.booking = FakeBooking(hold_ttl=hold_ttl)
        self.codepool = FakeCodePool()
        self.psp = FakePsp()
        self.settings = dataclasses.replace(Settings(), lease_seconds=lease_seconds, reconcile_after_seconds=60)
        # Every payment extends its hold unless a test sets a pay window (the steps are counted).
        options.setdefault("pay_window_seconds", math.inf)
        self.options = dataclasses.replace(CheckoutOptions(), poll_seconds=0.05, retry_base_seconds=0.02,
                                           retry_cap_seconds=0.2, **options)
        self.core = self.new_core("core-0")
        self.checkout, self.engine, self.worker, _ = self.build(self.core)
        # The use cases as the API answers them: tests assert what a caller is shown.
        self.service = AsTheApiAnswers(self.checkout)
        self.workers: list[asyncio.Task] = []
        self.server: GrpcServer | None = None

    def new_core(self, worker_id: str) -> PaymentsCore:
        return PaymentsCore(self.settings, self.pool, self.psp, options=PaymentsOptions(), metrics=PaymentsMetrics(),
                            worker_id=worker_id)

    def build(self, core):
        return wiring.build(self.settings, self.pool, core, options=self.options,
                            booking_stub=self.booking, codepool_stub=self.codepool)

    def start_workers(self, n: int = 1) -> None:
        for i in range(n):
            core = self.core if i == 0 else self.new_core(f"core-{i}")
            _, _, worker, _ = self.build(core)
            self.workers.append(asyncio.create_task(worker.run()))

    async def stop_workers(self) -> None:
        for t in self.workers:
            t.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        self.workers.clear()

    async def serve(self) -> grpc.aio.Channel:
        self.server = GrpcServer("payments", 0, host="127.0.0.1")
        checkout_pb2_grpc.add_CheckoutServiceServicer_to_server(CheckoutApi(self.checkout), self.server.server)
        self.server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
        await self.server.start()
        self.channel = acting_channel(f"127.0.0.1:{self.server.port}", "payments", CALLERS)
        return self.channel

    async def row(self, checkout_id: str):
        return await self.pool.fetchrow("SELECT * FROM checkouts WHERE id = $1", checkout_id)

    async def close(self) -> None:
        await self.stop_workers()
        if self.server is not None:
            await self.channel.close()
            await self.server.stop()
        # Park whatever this test left running: the next test's workers must not drive this
        # test's sagas against its own fakes.
        await self.pool.execute("UPDATE checkouts SET next_run_at = NULL, lease_owner = NULL, lease_until = NULL "
                                "WHERE next_run_at IS NOT NULL OR lease_owner IS NOT NULL")


@pytest_asyncio.fixture
async def make_harness(checkout_pool):
    made: list[Harness] = []

    def make(**kw) -> Harness:
        h = Harness(checkout_pool, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        await h.close()
    crash.configure("")


@pytest_asyncio.fixture
async def harness(make_harness) -> Harness:
    return make_harness()


@pytest.fixture
def endpoints(checkout_pool):
    """The merchants' webhook endpoints service (issue 12, item 6) over the real table."""
    return WebhookEndpoints(Endpoints(checkout_pool), "development", allow_private=True)


@pytest_asyncio.fixture
async def clean_endpoints(checkout_pool):
    """No endpoints before or after: those of earlier tests would fan events out to receivers that are gone."""
    await checkout_pool.execute("DELETE FROM webhook_endpoints")
    yield
    await checkout_pool.execute("DELETE FROM webhook_endpoints")


@pytest_asyncio.fixture
async def served(make_harness):
    """A NEEDS_ATTENTION checkout (the PSP refuses its refund), and both payments services served
    in process the way the payments pod serves them (the operator's view and tenancy tests).
    Yields (harness, checkout id, payment id); `harness.attention_customer` bought it."""
    h = make_harness(max_attempts=3)
    h.attention_customer = "customer-" + uuid.uuid4().hex[:8]
    h.start_workers(1)
    h.psp.refusing["refund"] = 10_000
    created = await h.service.create(h.attention_customer, validate_create(h.booking.add_slot(price=12345), "", 0), "")
    h.booking.started.add(created.slot_id)  # confirm refused: the saga must refund, and cannot
    paid = await h.service.pay(h.attention_customer, created.id, "pm_card_ok", "")

    async def needs_attention():
        return (await h.row(created.id))["state"] == "NEEDS_ATTENTION"
    await wait_for(needs_attention, timeout=10, message="NEEDS_ATTENTION")
    server = GrpcServer("payments", 0, host="127.0.0.1")
    checkout_pb2_grpc.add_CheckoutServiceServicer_to_server(CheckoutApi(h.checkout), server.server)
    payments_pb2_grpc.add_PaymentServiceServicer_to_server(PaymentApi(h.core, None), server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    server.add_service(payments_pb2.DESCRIPTOR.services_by_name["PaymentService"], PAYMENT_CALLERS,
                       system=PAYMENT_SYSTEM_RPCS, roles=PAYMENT_USER_ROLES)
    await server.start()
    h.addr = f"127.0.0.1:{server.port}"
    yield h, created.id, paid.payment.id
    await server.stop()
