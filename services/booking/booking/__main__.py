"""Composition root of the booking service: `python -m booking`."""
from __future__ import annotations

import asyncio
import pathlib

from cutylib.config import SERVICES, Settings, database_url_for, env_int
from cutylib.db import migrate
from cutylib.telemetry import init_telemetry

from .bootstrap import create_booking_pool, create_server

MIGRATIONS = pathlib.Path(__file__).resolve().parents[1] / "migrations"


async def main() -> None:
    settings = Settings.from_env()
    dsn = database_url_for("booking")
    await migrate(dsn, MIGRATIONS)
    pool = await create_booking_pool(dsn, settings)
    port = env_int("CUTY_BOOKING_GRPC_PORT", SERVICES["booking"][1])
    server = await create_server(settings, pool, port=port, host="0.0.0.0")
    server.on_stop(pool.close)
    await server.run_until_signal()


if __name__ == "__main__":
    # Before any server, channel or pool exists: instrumentation patches grpc.aio and asyncpg.
    init_telemetry("booking")
    asyncio.run(main())
