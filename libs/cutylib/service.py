"""The composition root every service shares: read config, migrate, pool, serve until SIGTERM.

    # services/<svc>/<svc>/__main__.py
    if __name__ == "__main__":
        run_service("booking", MIGRATIONS, create_server)
"""
from __future__ import annotations

import asyncio
import pathlib
from typing import Awaitable, Callable

import asyncpg

from .config import SERVICES, Settings, database_url_for, env_int, env_str
from .db import create_pool, migrate
from .grpc_server import GrpcServer
from .telemetry import init_telemetry

ServerFactory = Callable[..., Awaitable[GrpcServer]]
PoolFactory = Callable[[str, Settings], Awaitable[asyncpg.Pool]]


async def serve_service(name: str, migrations: pathlib.Path, create_server: ServerFactory, *,
                        pool_factory: PoolFactory | None = None) -> None:
    settings = Settings.from_env()
    settings.check_secrets()
    dsn = database_url_for(name)
    # Every replica runs this at start; the advisory lock in migrate() lets one apply each file.
    await migrate(dsn, migrations)
    if pool_factory is None:
        pool = await create_pool(dsn, min_size=settings.db_pool_min, max_size=settings.db_pool_max,
                                 application_name=f"cuty-{name}",
                                 acquire_timeout=settings.db_acquire_timeout_seconds)
    else:
        pool = await pool_factory(dsn, settings)
    port = env_int(f"CUTY_{name.upper()}_GRPC_PORT", SERVICES[name][1])
    host = env_str(f"CUTY_{name.upper()}_HOST", "0.0.0.0")
    server = await create_server(settings, pool, port=port, host=host)
    server.on_stop(pool.close)
    await server.run_until_signal()


def run_service(name: str, migrations: pathlib.Path, create_server: ServerFactory, *,
                pool_factory: PoolFactory | None = None) -> None:
    # Before any server, channel or pool exists: instrumentation patches grpc.aio and asyncpg.
    init_telemetry(name)
    asyncio.run(serve_service(name, migrations, create_server, pool_factory=pool_factory))
