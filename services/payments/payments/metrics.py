"""The payments service's metrics (docs/observability.md): finalize outcomes,
version conflicts, deferred finalizes, lease takeovers, webhooks, reconciliation, refunds; and the
checkout saga's (checkout/metrics.py, inherited: payments.checkout runs in this process). `REGISTRY` is the process's instance, exported on
CUTY_PAYMENTS_METRICS_PORT; a test's PaymentsCore gets `PaymentsMetrics()`, a private registry."""
from __future__ import annotations

import prometheus_client

from cutylib.metrics import LAG_BUCKETS

from .checkout.metrics import CheckoutMetrics

# Sample names tests and benchmarks read with `metrics.value(...)`.
VERSION_CONFLICTS = "cuty_payments_version_conflicts_total"
DEFERRED_FINALIZES = "cuty_payments_deferred_finalizes_total"
LEASE_TAKEOVERS = "cuty_payments_lease_takeovers_total"
RECONCILED_PAYMENTS = "cuty_payments_reconciled_total"
WEBHOOKS = "cuty_payments_webhooks_total"
FINALIZE = "cuty_payments_finalize_total"
AUDIT_FINDINGS = "cuty_payments_audit_findings_total"
AUDIT_LAG = """
SELECT coalesce(extract(epoch FROM clock_timestamp() - max(watermark)), 0) FROM audit_watermarks WHERE name = 'invariants'
"""

NON_TERMINAL_PAYMENTS = """
SELECT count(*) FILTER (WHERE updated_at < clock_timestamp() - make_interval(secs => $1)) AS backlog,
       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0) AS oldest_age
FROM payments_live  -- the payments not final (migration 0331), not the history
"""


class PaymentsMetrics(CheckoutMetrics):
    """The payments process's metrics: the core's, and the saga's it inherits (one registry)."""

    def __init__(self, registry=None):
        super().__init__(registry)
        c, h = self.counter, self.histogram
        # outcome: applied | same | stale | contradicts; source: sync | webhook | reconcile | ...
        self.finalize = c(FINALIZE, "finalize() results by source and outcome", ["source", "outcome"])
        self.version_conflicts = c(VERSION_CONFLICTS, "Finalize writes that lost the version race and re-read")
        self.deferred_finalizes = c(DEFERRED_FINALIZES, "Finalizes deferred: another worker held the payment's lease")
        self.lease_takeovers = c(LEASE_TAKEOVERS, "Expired payment leases taken over from another worker")
        # outcome: accepted | bad_signature | stale | duplicate | ignored
        self.webhooks = c(WEBHOOKS, "PSP webhook deliveries by event type and outcome", ["type", "outcome"])
        self.webhook_lag = h("cuty_payments_webhook_lag_seconds",
                             "From the PSP event's creation to its change applied to the payment", buckets=LAG_BUCKETS)
        # status: needs_response (opened) | under_review | won | lost; a lost one is alerted on
        # (DisputeLost; docs/payments.md, "Disputes").
        self.disputes = c("cuty_payments_disputes_total", "Disputes of captured payments, by the status they reached",
                          ["status"])
        # the refund path's outcome: reserved | replayed | succeeded | failed | pending
        self.refunds = c("cuty_payments_refunds_total", "Refunds by outcome (reserved in the database, settled "
                         "or refused by the PSP, left pending by a PSP timeout, replayed by key)", ["outcome"])
        self.reconciled = c(RECONCILED_PAYMENTS, "Payments moved by the reconciliation poller")
        self.reconcile_backlog = self.db_gauge("cuty_payments_reconcile_backlog",
                                   "Non-terminal payments unchanged for longer than CUTY_RECONCILE_AFTER_SECONDS")
        self.oldest_nonterminal = self.db_gauge("cuty_payments_oldest_nonterminal_payment_age_seconds",
                                    "Age of the oldest payment in a non-terminal status (0 when none)")
        # The invariant auditor (payments/audit.py): violations found, by kind (InvariantViolation),
        # what it checked, and how far behind its watermark is (AuditorBehind).
        self.audit_findings = c(AUDIT_FINDINGS, "Invariant violations the auditor found (each recorded once), "
                                "by kind", ["kind"])
        self.audit_checkouts = c("cuty_payments_audit_checkouts_total", "Checkouts the invariant auditor checked")
        self.audit_window_seconds = h("cuty_payments_audit_window_seconds", "Time to audit one window",
                                      buckets=LAG_BUCKETS)
        self.audit_lag = self.db_gauge("cuty_payments_audit_lag_seconds",
                                       "From the end of the last window audited to now (the auditor's watermark)")
        # The gauges read from the database (refresh below) are db_gauges: one replica exports them.

    async def refresh(self, pool, reconcile_after_seconds: float) -> None:
        """The gauges read from the database (cutylib.metrics.refresh_periodically)."""
        row = await pool.fetchrow(NON_TERMINAL_PAYMENTS, float(reconcile_after_seconds))
        self.reconcile_backlog.set(row["backlog"])
        self.oldest_nonterminal.set(float(row["oldest_age"]))
        self.audit_lag.set(float(await pool.fetchval(AUDIT_LAG)))
        await self.refresh_sagas(pool)


REGISTRY = PaymentsMetrics(prometheus_client.REGISTRY)


def count_refund(metrics: "PaymentsMetrics", outcome: str) -> None:
    metrics.refunds.labels(outcome).inc()
