"""Composition root of the payments orchestrator: `python -m payments`."""
from __future__ import annotations

import asyncio
import pathlib

from cutylib.config import SERVICES, Settings, database_url_for, env_int
from cutylib.db import create_pool, migrate
from cutylib.telemetry import init_telemetry

from .bootstrap import create_server

MIGRATIONS = pathlib.Path(__file__).resolve().parents[1] / "migrations"


async def main() -> None:
    settings = Settings.from_env()
    dsn = database_url_for("payments")
    await migrate(dsn, MIGRATIONS)
    pool = await create_pool(dsn, min_size=settings.db_pool_min, max_size=settings.db_pool_max,
                             application_name="cuty-payments")
    port = env_int("CUTY_PAYMENTS_GRPC_PORT", SERVICES["payments"][1])
    server = await create_server(settings, pool, port=port, host="0.0.0.0")
    server.on_stop(pool.close)
    await server.run_until_signal()


if __name__ == "__main__":
    # Before any server, channel or pool exists: instrumentation patches grpc.aio and asyncpg.
    init_telemetry("payments")
    asyncio.run(main())
