"""Settings of the payments service beyond cutylib's shared `Settings` (conventions.md)."""
from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from cutylib.config import env_field, env_float, env_int


def new_worker_id() -> str:
    """Lease owner identity: host and pid say which replica, the random part which incarnation."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class PaymentsOptions:
    # One PSP HTTP attempt; a timeout means "unknown", never "failed".
    psp_timeout_seconds: float = env_field(env_float, "CUTY_PSP_TIMEOUT_SECONDS", 3.0)
    # Extra attempts on 5xx / connection errors / timeouts (every PSP call we make is idempotent).
    psp_retries: int = env_field(env_int, "CUTY_PSP_RETRIES", 2)
    psp_backoff_seconds: float = env_field(env_float, "CUTY_PSP_BACKOFF_SECONDS", 0.1)
    # How often the webhook-retry and reconciliation workers look for due work.
    poll_seconds: float = env_field(env_float, "CUTY_PAYMENTS_POLL_SECONDS", 1.0)
    batch_size: int = env_field(env_int, "CUTY_PAYMENTS_BATCH_SIZE", 50)
    # A stored webhook whose inline handling died is retried by a worker after this long.
    event_retry_seconds: float = env_field(env_float, "CUTY_PSP_EVENT_RETRY_SECONDS", 5.0)
    # Test hook (tests/e2e/payments/test_lease_fencing.py): a leased worker waits this long between
    # reading the version and writing, so a test can SIGSTOP it there. Never set in production.
    test_pause_after_lease_ms: int = env_field(env_int, "CUTY_TEST_PAUSE_AFTER_LEASE_MS", 0)
    webhook_tolerance_seconds: int = 300
