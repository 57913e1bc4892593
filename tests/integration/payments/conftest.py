"""Fixtures for the payments core against the real PostgreSQL (a fake PSP, in process)."""
from __future__ import annotations

import dataclasses

import pytest
import pytest_asyncio

from cutylib.config import Settings
from payments.bootstrap import create_payments_pool
from payments.service import PaymentsCore
from payments.metrics import PaymentsMetrics
from payments.settings import PaymentsOptions

from payments_events import PREVIOUS_SECRET, WEBHOOK_SECRET
from cutylib.testing.fake_psp import FakePsp


@pytest_asyncio.fixture(scope="session")
async def payments_pool(payments_service_dsn):
    pool = await create_payments_pool(payments_service_dsn,
                                      dataclasses.replace(Settings(), db_pool_min=2, db_pool_max=60))
    yield pool
    await pool.close()


@pytest.fixture
def fake_psp() -> FakePsp:
    return FakePsp()


@pytest.fixture
def make_core(payments_pool, fake_psp):
    """make_core(**settings) -> a PaymentsCore with its own worker id and metrics."""
    made = 0

    def make(*, lease_seconds: float = 30, reconcile_after_seconds: float = 60, psp=None, **options) -> PaymentsCore:
        nonlocal made
        made += 1
        settings = dataclasses.replace(Settings(), lease_seconds=lease_seconds,
                                       reconcile_after_seconds=reconcile_after_seconds)
        opts = dataclasses.replace(PaymentsOptions(), poll_seconds=0.05, **options)
        return PaymentsCore(settings, payments_pool, psp or fake_psp, options=opts, metrics=PaymentsMetrics(),
                            worker_id=f"test-worker-{made}")

    return make


@pytest.fixture
def core(make_core) -> PaymentsCore:
    return make_core()


@pytest_asyncio.fixture
async def payments_server(payments_pool, fake_psp):
    """PaymentService in process (fake PSP, workers running), and a stub to it."""
    import grpc

    from cuty.payments.v1 import payments_pb2_grpc
    from cutylib.testing.trust import acting_channel
    from payments.bootstrap import create_server
    from payments.grpc_api import CALLERS

    settings = dataclasses.replace(Settings(), psp_webhook_secret=WEBHOOK_SECRET,
                                   psp_webhook_previous_secrets=PREVIOUS_SECRET, lease_seconds=1.0)
    options = dataclasses.replace(PaymentsOptions(), poll_seconds=0.05)
    server = await create_server(settings, payments_pool, psp=fake_psp, options=options)
    await server.start()
    channel = acting_channel(f"127.0.0.1:{server.port}", "payments", CALLERS)
    yield payments_pb2_grpc.PaymentServiceStub(channel)
    await channel.close()
    await server.stop()
