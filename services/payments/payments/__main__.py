"""Composition root of the payments orchestrator: `python -m payments`."""
from __future__ import annotations

import pathlib

from cutylib.service import run_service

from .bootstrap import create_payments_pool, create_server

MIGRATIONS = pathlib.Path(__file__).resolve().parents[1] / "migrations"

if __name__ == "__main__":
    run_service("payments", MIGRATIONS, create_server, pool_factory=create_payments_pool)
