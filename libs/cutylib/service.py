"""The composition root every service shares: read config, migrate, pool, serve until SIGTERM.

    # services/<svc>/<svc>/__main__.py
    if __name__ == "__main__":
        run_service("booking", MIGRATIONS, create_server)
"""
from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import sys
from typing import Awaitable, Callable

import asyncpg

from . import heap
from .config import SERVICES, Settings, database_url_for, env_bool, env_int, env_str, health_port_for, migration_url_for
from .dbwatch import DatabaseWatch
from .db import create_pool, migrate
from .grpc_server import GrpcServer
from .metrics import metrics_enabled, register_pool, start_metrics_server
from .telemetry import init_telemetry

ServerFactory = Callable[..., Awaitable[GrpcServer]]
PoolFactory = Callable[[str, Settings], Awaitable[asyncpg.Pool]]


async def serve_service(name: str, migrations: pathlib.Path, create_server: ServerFactory, *,
                        pool_factory: PoolFactory | None = None) -> None:
    """Serve whether or not the database answers yet (docs/deploy.md): the pool is created without
    connecting, health starts NOT_SERVING, and the server's DatabaseWatch migrates (unless
    CUTY_MIGRATE_ON_START=false: a Job runs `python -m <service> migrate`), warms the pool up to
    CUTY_DB_POOL_MIN and follows the database from then on."""
    settings = Settings.from_env()
    settings.check_secrets(name)
    dsn = database_url_for(name)
    lazy = dataclasses.replace(settings, db_pool_min=0)  # connect on demand: the database may be away
    if pool_factory is None:
        pool = await create_pool(dsn, min_size=0, max_size=settings.db_pool_max, application_name=f"cuty-{name}",
                                 acquire_timeout=settings.db_acquire_timeout_seconds)
    else:
        pool = await pool_factory(dsn, lazy)
    port = env_int(f"CUTY_{name.upper()}_GRPC_PORT", SERVICES[name][1])
    host = env_str(f"CUTY_{name.upper()}_HOST", "0.0.0.0")
    server = await create_server(settings, pool, port=port, host=host)
    server.add_health_port(host, env_int(f"CUTY_{name.upper()}_HEALTH_PORT", health_port_for(name)))
    # Every replica may migrate at start; the advisory lock in migrate() lets one apply each file.
    # Migrations run as the database's owner; the pool connects as the service's role (docs/security.md).
    server.watch_database(DatabaseWatch(pool, migration_url_for(name), migrations, migrate_on_start=env_bool("CUTY_MIGRATE_ON_START", True),
                                        warm_connections=settings.db_pool_min))
    server.on_stop(pool.close)
    register_pool(name, pool)
    # Prometheus scrapes a port of its own (CUTY_<SERVICE>_METRICS_PORT), never the gRPC one.
    if metrics_enabled():
        start_metrics_server(name)
    heap.settle()  # what is built so far lives as long as the process (heap.py)
    await server.run_until_signal()


async def migrate_only(name: str, migrations: pathlib.Path) -> int:
    """`python -m <service> migrate`: apply pending migrations and exit (a Kubernetes Job, or an
    init container). Safe to run concurrently with itself and with starting replicas."""
    applied = await migrate(migration_url_for(name), migrations)
    print(f"{name}: {len(applied)} migration(s) applied" + (f": {', '.join(applied)}" if applied else ""))
    return 0


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop (pinned in requirements.lock) unless CUTY_EVENT_LOOP=asyncio: its socket
    I/O and callback scheduling are C, where asyncio's are Python, and on the checkout path they
    were the largest share of every process's CPU (docs/benchmarks.md). None: asyncio's."""
    if env_str("CUTY_EVENT_LOOP", "uvloop") == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:  # a dev venv without it: asyncio's loop, same behaviour
        return None
    return uvloop.new_event_loop


def run_service(name: str, migrations: pathlib.Path, create_server: ServerFactory, *,
                pool_factory: PoolFactory | None = None) -> None:
    """`python -m <service>` serves; `python -m <service> migrate` applies the migrations and exits."""
    if sys.argv[1:2] == ["migrate"]:
        sys.exit(asyncio.run(migrate_only(name, migrations)))
    # Before any server, channel or pool exists: instrumentation patches grpc.aio and asyncpg.
    init_telemetry(name)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve_service(name, migrations, create_server, pool_factory=pool_factory))
