"""Real processes for the payments e2e tests: the PSP simulator, the payments orchestrator and the
webhook relay (the gateway's PSP route), on the session's PostgreSQL."""
from __future__ import annotations

import asyncpg
import grpc
import httpx
import pytest_asyncio

from cuty.payments.v1 import payments_pb2_grpc
from cutylib.testing.stack import Stack
from cutylib.testing.trust import acting_channel
from payments.grpc_api import CALLERS

# Small thresholds so reconciliation and the sync-timeout scenario finish within seconds.
E2E_ENV = {
    "CUTY_RECONCILE_AFTER_SECONDS": 0.5,
    "CUTY_PAYMENTS_POLL_SECONDS": 0.1,
    "CUTY_PSP_TIMEOUT_SECONDS": 0.5,
    "CUTY_PSP_RETRIES": 2,
    "CUTY_PSP_SYNC_TIMEOUT_DELAY_SECONDS": 1.5,
    "CUTY_PSP_WEBHOOK_RETRY_BASE_SECONDS": 0.05,
}


class PaymentsStack:
    def __init__(self, stack: Stack, db: asyncpg.Pool, channel: grpc.aio.Channel):
        self.stack = stack
        self.db = db
        self.channel = channel
        self.stub = payments_pb2_grpc.PaymentServiceStub(channel)

    async def psp(self, method: str, path: str, **kw) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.stack.psp_url, timeout=5) as c:
            return await c.request(method, path, **kw)

    async def ledger(self) -> dict:
        return (await self.psp("GET", "/v1/_ledger")).json()

    async def psp_events(self) -> list[dict]:
        return (await self.psp("GET", "/v1/_events")).json()["events"]


@pytest_asyncio.fixture(scope="module")
async def payments_stack(pg, payments_dsn, tmp_path_factory):
    stack = Stack(pg.dsn, tmp_path_factory.mktemp("payments-e2e"), services=("payments",), env=E2E_ENV)
    await stack.start()
    db = await asyncpg.create_pool(payments_dsn, min_size=1, max_size=4)
    channel = acting_channel(stack.payments_addrs[0], "payments", CALLERS)
    try:
        yield PaymentsStack(stack, db, channel)
    finally:
        await channel.close()
        await db.close()
        await stack.stop()
