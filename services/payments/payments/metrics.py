"""In-process counters for the payment paths (DESIGN.md, "Observability": version conflicts, deferred
finalizes, lease contention...). Per process; logged periodically and on shutdown."""
from __future__ import annotations

from cutylib.metrics import Metrics, log_periodically  # noqa: F401 - re-exported for the service

VERSION_CONFLICTS = "version_conflicts"
DEFERRED_FINALIZES = "deferred_finalizes"
LEASE_TAKEOVERS = "lease_takeovers"
DUPLICATE_WEBHOOKS = "duplicate_webhooks"
RECONCILED_PAYMENTS = "reconciled_payments"
STALE_OBSERVATIONS = "stale_observations"
CONTRADICTIONS = "contradictions"
WEBHOOKS_REFUSED = "webhooks_refused"
PSP_EVENTS_PURGED = "psp_events_purged"          # handled webhook events past CUTY_PSP_EVENT_RETENTION_DAYS
SAGAS_NEED_ATTENTION = "sagas_need_attention"    # a finishing step gave up: an operator must look
SAGAS_RETRIED_BY_OPERATOR = "sagas_retried_by_operator"


REGISTRY = Metrics()
