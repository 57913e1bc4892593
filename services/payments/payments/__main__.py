"""Composition root of the payments orchestrator: `python -m payments` serves; `python -m payments
migrate` migrates; `python -m payments ops ...` is the operator's view (payments/ops/);
`python -m payments evidence ...` exports chargeback evidence (payments/evidence.py);
`python -m payments webhooks-out` runs only the merchants' webhook delivery workers
(payments/outbound/process.py)."""
from __future__ import annotations

import pathlib
import sys

from cutylib.service import run_service

from .bootstrap import create_payments_pool, create_server

MIGRATIONS = pathlib.Path(__file__).resolve().parents[1] / "migrations"

if __name__ == "__main__":
    if sys.argv[1:2] == ["ops"]:
        from .ops import main as ops_main

        sys.exit(ops_main(sys.argv[2:]))
    if sys.argv[1:2] == ["evidence"]:
        from .evidence import main as evidence_main

        sys.exit(evidence_main(sys.argv[2:]))
    if sys.argv[1:2] == ["webhooks-out"]:
        from .outbound.process import main as webhooks_out_main

        sys.exit(webhooks_out_main(MIGRATIONS))
    run_service("payments", MIGRATIONS, create_server, pool_factory=create_payments_pool)
