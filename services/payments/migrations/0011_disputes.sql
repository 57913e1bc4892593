-- Disputes (chargebacks; docs/payments.md, "Disputes"): the PSP tells of a dispute on a captured
-- charge (charge.dispute.created) and later of its outcome (charge.dispute.closed, won or lost).
-- One row per PSP dispute, written by the statement that stores the webhook (payments/disputes/
-- inbox.py), with its timeline event and merchant event; the evidence the platform assembled, and
-- when it was submitted; forward only (disputes_forward_only).
CREATE TABLE disputes (
    merchant_id           text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    id                    uuid NOT NULL DEFAULT gen_random_uuid(),
    payment_id            uuid NOT NULL REFERENCES payments (id),
    checkout_id           uuid,
    psp_dispute_id        text NOT NULL CHECK (length(psp_dispute_id) BETWEEN 1 AND 255),
    status                text NOT NULL CHECK (status IN ('needs_response', 'under_review', 'won', 'lost')),
    amount_minor          bigint NOT NULL CHECK (amount_minor > 0),
    currency              text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    reason                text NOT NULL DEFAULT '',
    evidence_due_by       timestamptz NOT NULL,
    evidence              jsonb,
    evidence_submitted_at timestamptz,
    -- The evidence worker's claim (SKIP LOCKED + lease): one replica assembles and submits at a time.
    lease_owner           text,
    lease_until           timestamptz,
    attempts              integer NOT NULL DEFAULT 0,
    last_error            text NOT NULL DEFAULT '',
    created_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    closed_at             timestamptz,
    PRIMARY KEY (merchant_id, id),
    CONSTRAINT disputes_psp_id UNIQUE (psp_dispute_id),
    CHECK ((status IN ('won', 'lost')) = (closed_at IS NOT NULL)),
    CHECK ((evidence IS NULL) = (evidence_submitted_at IS NULL))
);
CREATE INDEX disputes_payment ON disputes (merchant_id, payment_id);
-- The evidence worker's queue: open disputes whose evidence is not submitted yet, by deadline.
CREATE INDEX disputes_evidence_due ON disputes (evidence_due_by)
    WHERE status = 'needs_response' AND evidence_submitted_at IS NULL;
CREATE TRIGGER disputes_forward_only BEFORE UPDATE ON disputes FOR EACH ROW EXECUTE FUNCTION disputes_forward_only();
SELECT cuty_tenant_table('disputes');

ALTER TABLE payment_events DROP CONSTRAINT payment_events_source_check;
-- payment_events may be partitioned already (when the partitioning migration ran first on this
-- database): a partition may then hold its own copy of the old CHECK, which the parent's DROP
-- leaves behind; those go too, and the parent's new CHECK reaches every partition.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.conrelid::regclass AS t FROM pg_constraint c JOIN pg_inherits i ON i.inhrelid = c.conrelid
             WHERE i.inhparent = 'payment_events'::regclass AND c.conname = 'payment_events_source_check' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT payment_events_source_check', r.t);
    END LOOP;
END $$;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_source_check
    CHECK (source IN ('sync', 'webhook', 'reconcile', 'saga', 'claim', 'dispute'));

ALTER TABLE merchant_events DROP CONSTRAINT merchant_events_type_check;
ALTER TABLE merchant_events ADD CONSTRAINT merchant_events_type_check CHECK (type IN (
    'checkout.completed', 'booking.confirmed', 'codes.delivered', 'checkout.refunded', 'booking.cancelled',
    'booking.rescheduled', 'stock.low', 'code.claimed', 'code.replaced', 'code.claim_rejected',
    'code.claim_refunded', 'batch.quarantined', 'payment.disputed', 'payment.dispute_closed'));
