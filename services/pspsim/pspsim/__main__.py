"""``python -m pspsim``: serve the PSP simulator with settings from CUTY_PSP_* variables."""

from __future__ import annotations

import logging.config
import sys

from .logs import log_config
from .server import serve
from .settings import Settings


def main() -> int:
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"pspsim: {exc}", file=sys.stderr)
        return 2
    logging.config.dictConfig(log_config(settings.log_level))
    serve(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
