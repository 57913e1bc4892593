"""The checkout saga end to end: real processes (PSP simulator, booking, code pool, payments
orchestrator replicas, the webhook relay) on the session's PostgreSQL.

Each stack gets databases of its own (CUTY_<SVC>_DATABASE_URL), so no other suite's leftover
sagas are driven by (or crash) these orchestrators, and assertions on the booking / code-pool
tables see only this stack's rows.
"""
from __future__ import annotations

import pytest_asyncio

from checkout_e2e import start_stack


@pytest_asyncio.fixture(scope="module")
async def shop(pg, tmp_path_factory):
    """One stack for a module: a single orchestrator, normal hold TTLs."""
    s = await start_stack(pg, tmp_path_factory.mktemp("checkout-e2e"))
    yield s
    await s.close()
