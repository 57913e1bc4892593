"""The delivery workers' metrics (docs/observability.md, "Merchant webhooks"): attempts by outcome and
error class, circuits opened, what the workers run now, and gauges read from the database (the
backlog, the oldest due delivery's wait, the circuits open).

Registered only in a process that runs delivery workers (`process_metrics()`, on first use), so a
payments process with CUTY_WEBHOOKS_OUT_WORKERS=0 does not export a backlog of zero beside the real
one of the `payments-webhooks-out` replicas. Every replica reads the same database: take `max()` of
the gauges across replicas, `sum()` of the counters.
"""
from __future__ import annotations

import functools

import prometheus_client

from cutylib.metrics import DURATION_BUCKETS, Metrics

DELIVERIES = "cuty_payments_webhook_deliveries_total"
CIRCUITS_OPENED = "cuty_payments_webhook_circuits_opened_total"
CIRCUITS_OPEN = "cuty_payments_webhook_circuits_open"
BACKLOG = "cuty_payments_webhook_backlog"
OLDEST_DUE_AGE = "cuty_payments_webhook_oldest_due_age_seconds"
IN_FLIGHT = "cuty_payments_webhook_in_flight"
REDELIVERIES = "cuty_payments_webhook_redeliveries_total"


class OutboundMetrics(Metrics):
    def __init__(self, registry=None):
        super().__init__(registry)
        c, g = self.counter, self.gauge
        # outcome: delivered | retrying | failed | lease_lost; error: "" or the class of the attempt's
        # log (timeout, connection_refused, tls, dns, forbidden_address, http_<status>, ...).
        self.deliveries = c(DELIVERIES, "Webhook delivery attempts by outcome and error class",
                            ["outcome", "error"])
        self.duration = self.histogram("cuty_payments_webhook_attempt_duration_seconds",
                                       "One webhook delivery attempt, connect to answer", buckets=DURATION_BUCKETS)
        self.circuits_opened = c(CIRCUITS_OPENED, "Endpoint circuits opened (failures in a row reached the threshold)")
        self.in_flight = g(IN_FLIGHT, "Delivery attempts this process runs now")
        self.circuits_open = g(CIRCUITS_OPEN, "Endpoints whose circuit is open now (refreshed from the database)")
        self.backlog = g(BACKLOG, "Deliveries due now and not claimed (refreshed from the database)")
        self.oldest_due_age = g(OLDEST_DUE_AGE, "How long the oldest due delivery has waited (0 when none; refreshed)")

    async def refresh(self, deliveries) -> None:
        """The gauges read from the database (cutylib.metrics.refresh_periodically); `deliveries`
        is a repository.Deliveries."""
        got = await deliveries.gauges()
        self.backlog.set(got["backlog"])
        self.oldest_due_age.set(got["oldest_due_age"])
        self.circuits_open.set(got["circuits_open"])


class RedeliveryMetrics(Metrics):
    """Counted by the admin API (the payments process): manual redeliveries by outcome."""

    def __init__(self, registry=None):
        super().__init__(registry)
        # outcome: queued | in_flight | rate_limited
        self.redeliveries = self.counter(REDELIVERIES, "Manual webhook redeliveries by outcome", ["outcome"])


@functools.lru_cache(maxsize=1)
def process_metrics() -> OutboundMetrics:
    """This process's delivery metrics, in the default registry (exported on its metrics port)."""
    return OutboundMetrics(prometheus_client.REGISTRY)


@functools.lru_cache(maxsize=1)
def process_redelivery_metrics() -> RedeliveryMetrics:
    return RedeliveryMetrics(prometheus_client.REGISTRY)
