"""The checkout saga's metrics (docs/observability.md): ends, step durations, compensations,
retries, operators' work, and per non-terminal state the sagas waiting and the oldest's age.

The payments process exports one registry: `payments.metrics.PaymentsMetrics` extends this class
with the core's own, and the saga is handed that object typed as `CheckoutMetrics`."""
from __future__ import annotations

from cutylib.metrics import LAG_BUCKETS, Metrics

from . import domain

SAGAS_NEED_ATTENTION = "cuty_checkout_sagas_need_attention_total"
SAGAS_RETRIED_BY_OPERATOR = "cuty_checkout_sagas_retried_by_operator_total"

# The saga states a checkout waits in (domain.TERMINAL's complement); the "stuck" gauges report each.
NON_TERMINAL = domain.NON_TERMINAL

# From the live sagas (migration 0330), not the history: a row per saga not finished.
SAGAS_BY_STATE = """
SELECT state, count(*) AS n, extract(epoch FROM clock_timestamp() - min(updated_at)) AS oldest_age
FROM sagas_live WHERE state = ANY($1::text[]) GROUP BY state
"""


class CheckoutMetrics(Metrics):
    def __init__(self, registry=None):
        super().__init__(registry)
        c, h = self.counter, self.histogram
        self.sagas_finished = c("cuty_checkout_sagas_finished_total", "Checkouts that reached an end state",
                                ["state"])
        self.step_duration = h("cuty_checkout_step_duration_seconds", "Saga step duration by step", ["step"],
                               buckets=LAG_BUCKETS)
        # kind: release | cancel_intent | refund
        self.compensations = c("cuty_checkout_compensations_total", "Compensation steps performed", ["kind"])
        self.retries = c("cuty_checkout_retries_total", "Saga steps that failed and were scheduled again, by "
                         "the state they failed in", ["state"])
        self.need_attention = c(SAGAS_NEED_ATTENTION, "Checkouts whose finishing step gave up (NEEDS_ATTENTION): "
                                "an operator must look")
        self.operator_retries = c(SAGAS_RETRIED_BY_OPERATOR, "NEEDS_ATTENTION checkouts put back to work by an operator")
        self.late_captures = c("cuty_checkout_late_captures_total",
                               "Payments captured after the saga had started releasing")
        self.sagas = self.db_gauge("cuty_checkout_sagas", "Checkouts per non-terminal state (refreshed periodically)", ["state"])
        self.oldest_saga = self.db_gauge("cuty_checkout_oldest_saga_age_seconds", "Per non-terminal state, how long the "
                             "oldest checkout has been in it (0 when none; refreshed periodically)", ["state"])

    async def refresh_sagas(self, pool) -> None:
        """The saga gauges, read from the database."""
        by_state = {r["state"]: r for r in await pool.fetch(SAGAS_BY_STATE, list(NON_TERMINAL))}
        for state in NON_TERMINAL:
            r = by_state.get(state)
            self.sagas.labels(state).set(r["n"] if r else 0)
            self.oldest_saga.labels(state).set(float(r["oldest_age"]) if r else 0.0)
