-- Issue 15, "one trace per checkout": the W3C traceparent of the request that created the
-- checkout. Saga steps run later by any worker continue that trace (docs/observability.md).
ALTER TABLE checkouts ADD COLUMN traceparent text;

-- The "stuck sagas" gauges (payments/metrics.py) read, per non-terminal state, the count and the
-- oldest row every CUTY_METRICS_REFRESH_SECONDS: an index over the few live rows, not the history.
CREATE INDEX checkouts_live_by_state ON checkouts (state, updated_at)
    WHERE state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED');
