"""``python -m pspsim``: serve the PSP simulator with settings from CUTY_PSP_* variables."""

from __future__ import annotations

import logging.config
import signal
import sys

from .logs import log_config
from .server import serve
from .settings import Settings


def _exit_cleanly(signum: int, frame: object) -> None:
    # uvicorn drains and shuts down on SIGINT/SIGTERM, then re-raises the signal with the
    # previous handler restored: that is this one, so a signalled stop exits with status 0.
    raise SystemExit(0)


def main() -> int:
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"pspsim: {exc}", file=sys.stderr)
        return 2
    logging.config.dictConfig(log_config(settings.log_level))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    serve(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
