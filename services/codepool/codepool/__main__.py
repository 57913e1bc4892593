"""`python -m codepool` serves; `python -m codepool import ...` and `python -m codepool rotate ...`
are the operator commands (see `--help`); `python -m codepool ops code ...` the incident story
(codepool/ops.py)."""
from __future__ import annotations

import pathlib
import sys

MIGRATIONS = pathlib.Path(__file__).resolve().parents[1] / "migrations"


def main(argv: list[str]) -> int:
    if argv[:1] == ["ops"]:
        from .ops import main as ops_main

        return ops_main(argv[1:])
    if argv and argv[0] in ("import", "rotate", "-h", "--help"):
        from .cli import main as cli_main

        return cli_main(argv)
    from cutylib.service import run_service

    from .bootstrap import create_codepool_pool, create_server

    run_service("codepool", MIGRATIONS, create_server, pool_factory=create_codepool_pool)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
