-- PSP webhook events, stored (deduplicated on the PSP's event id) before the PSP is acknowledged.
CREATE TABLE psp_events (
    event_id         text PRIMARY KEY,
    type             text NOT NULL,
    payment_id       uuid REFERENCES payments (id),
    payload          jsonb NOT NULL,
    -- received: stored, being handled inline; deferred: the payment's lease was held by another
    -- worker, retried at next_attempt_at; processed / ignored: done.
    status           text NOT NULL DEFAULT 'received'
        CHECK (status IN ('received', 'processed', 'deferred', 'ignored')),
    attempts         integer NOT NULL DEFAULT 0,
    -- A 'received' event whose inline handling died (process killed) is picked up once this passes.
    next_attempt_at  timestamptz,
    last_error       text NOT NULL DEFAULT '',
    received_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    processed_at     timestamptz
);

CREATE INDEX psp_events_due ON psp_events (next_attempt_at) WHERE status IN ('received', 'deferred');
CREATE INDEX psp_events_payment ON psp_events (payment_id) WHERE payment_id IS NOT NULL;
