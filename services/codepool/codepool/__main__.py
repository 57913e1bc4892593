"""`python -m codepool` serves; `python -m codepool import ...` and `python -m codepool rotate ...`
are the operator commands (see `--help`)."""
from __future__ import annotations

import asyncio
import pathlib
import sys

MIGRATIONS = pathlib.Path(__file__).resolve().parents[1] / "migrations"


async def serve() -> None:
    from cutylib.config import Settings, database_url_for, env_int, env_str
    from cutylib.db import create_pool, migrate
    from cutylib.telemetry import init_telemetry

    from .bootstrap import create_server

    init_telemetry("codepool")
    settings = Settings.from_env()
    dsn = database_url_for("codepool")
    await migrate(dsn, MIGRATIONS)
    pool = await create_pool(dsn, min_size=settings.db_pool_min, max_size=settings.db_pool_max,
                             application_name="cuty-codepool")
    port = env_int("CUTY_CODEPOOL_GRPC_PORT", 50052)
    server = await create_server(settings, pool, port=port, host=env_str("CUTY_CODEPOOL_HOST", "0.0.0.0"))
    server.on_stop(pool.close)
    await server.run_until_signal()


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("import", "rotate", "-h", "--help"):
        from .cli import main as cli_main

        return cli_main(argv)
    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
