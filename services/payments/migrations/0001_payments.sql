-- Payments against the PSP (issue 4). One finalize path writes `payments` with a version token;
-- every accepted change appends to `payment_events` in the same transaction.

CREATE TABLE payments (
    id               uuid PRIMARY KEY,
    checkout_id      uuid,
    customer_id      text NOT NULL DEFAULT '',
    status           text NOT NULL DEFAULT 'created'
        CHECK (status IN ('created', 'requires_action', 'processing', 'succeeded', 'failed', 'canceled', 'refunded')),
    -- The version token: every accepted change is UPDATE ... WHERE id = $1 AND version = $2.
    version          bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    -- The lease keeps two webhook/reconcile workers off one payment; a worker whose lease expired
    -- and was taken over is fenced by the version token, not by the lease.
    lease_owner      text,
    lease_until      timestamptz,
    psp_intent_id    text UNIQUE,
    psp_refund_id    text,
    -- From our own records, never from the client.
    amount_minor     bigint NOT NULL CHECK (amount_minor > 0),
    currency         text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    payment_method   text NOT NULL CHECK (payment_method <> ''),
    -- The payment attempt id; also the PSP's Idempotency-Key.
    idempotency_key  text NOT NULL UNIQUE CHECK (idempotency_key <> ''),
    redirect_url     text,
    client_secret    text,
    failure_reason   text,
    -- When reconciliation should next ask the PSP; NULL once terminal.
    reconcile_at     timestamptz,
    reconcile_attempts integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- DESIGN.md invariant 6 at the storage level: only a payment waiting for the customer keeps
    -- the customer action, so no code path can hand a terminal payment's secret to anyone.
    CONSTRAINT payments_action_only_while_waiting
        CHECK (status = 'requires_action' OR (redirect_url IS NULL AND client_secret IS NULL)),
    CONSTRAINT payments_lease_whole CHECK ((lease_owner IS NULL) = (lease_until IS NULL))
);

CREATE INDEX payments_checkout ON payments (checkout_id) WHERE checkout_id IS NOT NULL;
-- The reconciliation poller's queue: SKIP LOCKED walks this small partial index.
CREATE INDEX payments_reconcile_due ON payments (reconcile_at)
    WHERE status IN ('created', 'requires_action', 'processing');

-- The same forward-only table as payments/domain.py, so a regression is refused by the database
-- whatever code wrote it; a status change must also bump the version by exactly one.
CREATE FUNCTION payments_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version <> OLD.version AND NEW.version <> OLD.version + 1 THEN
        RAISE EXCEPTION 'payment % version must rise by one, % -> %', OLD.id, OLD.version, NEW.version
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        IF NEW.version <> OLD.version + 1 THEN
            RAISE EXCEPTION 'payment % status change without a version bump', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NOT (
            (OLD.status = 'created' AND NEW.status IN ('requires_action', 'processing', 'succeeded', 'failed', 'canceled'))
            OR (OLD.status = 'requires_action' AND NEW.status IN ('processing', 'succeeded', 'failed', 'canceled'))
            OR (OLD.status = 'processing' AND NEW.status IN ('succeeded', 'failed', 'canceled'))
            OR (OLD.status = 'succeeded' AND NEW.status = 'refunded')
        ) THEN
            RAISE EXCEPTION 'payment % may not move from % to %', OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER payments_forward_only BEFORE UPDATE ON payments
    FOR EACH ROW EXECUTE FUNCTION payments_forward_only();

-- The timeline: "what happened to payment X" without a tracing backend. The checkout saga appends
-- its own transitions here too (checkout_id set, payment_id possibly NULL).
CREATE TABLE payment_events (
    seq          bigserial PRIMARY KEY,
    payment_id   uuid REFERENCES payments (id),
    checkout_id  uuid,
    source       text NOT NULL CHECK (source IN ('sync', 'webhook', 'reconcile', 'saga')),
    from_status  text,
    to_status    text NOT NULL,
    version      bigint,
    trace_id     text NOT NULL DEFAULT '',
    note         text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (payment_id IS NOT NULL OR checkout_id IS NOT NULL)
);

CREATE INDEX payment_events_payment ON payment_events (payment_id, seq) WHERE payment_id IS NOT NULL;
CREATE INDEX payment_events_checkout ON payment_events (checkout_id, seq) WHERE checkout_id IS NOT NULL;

CREATE FUNCTION payment_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payment_events is append-only' USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER payment_events_append_only BEFORE UPDATE OR DELETE ON payment_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_append_only();
