-- Issue 12, item 3: refunds by the merchant's staff, full or partial, never more than captured.
--
-- Every refund is a row of `refunds`, and the payment keeps two running totals, written by the same
-- statement that inserts or settles a refund (payments/repository.py RESERVE_REFUND, SETTLE_REFUND):
--   refunded_minor        what is refunded or being refunded (pending + succeeded refunds). The CHECK
--                         refunded_minor <= amount_minor is what refuses an over-refund, whoever races:
--                         the reservation is one conditional UPDATE of the payment row, so concurrent
--                         refunds for the last amount queue on that row and exactly the ones that fit
--                         succeed.
--   refund_settled_minor  what the PSP confirmed; it decides the status (partially_refunded while
--                         0 < settled < amount, refunded at amount).

ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check CHECK (status IN (
    'created', 'requires_action', 'processing', 'succeeded', 'failed', 'canceled', 'partially_refunded', 'refunded'));

ALTER TABLE payments ADD COLUMN refunded_minor bigint NOT NULL DEFAULT 0;
ALTER TABLE payments ADD COLUMN refund_settled_minor bigint NOT NULL DEFAULT 0;
-- A payment refunded before this migration was refunded in full (the saga's refunds were full-only).
-- The version trigger allows an update that changes neither status nor version.
UPDATE payments SET refunded_minor = amount_minor, refund_settled_minor = amount_minor WHERE status = 'refunded';
ALTER TABLE payments ADD CONSTRAINT payments_refunds_within_capture CHECK (
    refund_settled_minor >= 0 AND refund_settled_minor <= refunded_minor AND refunded_minor <= amount_minor);
-- Only a captured payment has anything refunded, and the status says how much was settled.
ALTER TABLE payments ADD CONSTRAINT payments_refunds_only_captured CHECK (
    refunded_minor = 0 OR status IN ('succeeded', 'partially_refunded', 'refunded'));
ALTER TABLE payments ADD CONSTRAINT payments_refund_status CHECK (
    (status = 'refunded') = (refund_settled_minor = amount_minor)
    AND (status = 'partially_refunded') = (refund_settled_minor > 0 AND refund_settled_minor < amount_minor));

-- The forward-only table of migration 0001, with the refund states (payments/domain.py TRANSITIONS).
CREATE OR REPLACE FUNCTION payments_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
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
            OR (OLD.status = 'succeeded' AND NEW.status IN ('partially_refunded', 'refunded'))
            OR (OLD.status = 'partially_refunded' AND NEW.status = 'refunded')
        ) THEN
            RAISE EXCEPTION 'payment % may not move from % to %', OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TABLE refunds (
    id              uuid PRIMARY KEY,
    merchant_id     text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    payment_id      uuid NOT NULL,
    -- The caller's Idempotency-Key (the saga's: its refund step key), unique per payment and merchant.
    key             text NOT NULL CHECK (key <> '' AND length(key) <= 255),
    -- What was asked: NULL = "the rest of what was captured" (kept to tell a replay from a reuse).
    requested_minor bigint CHECK (requested_minor > 0),
    amount_minor    bigint NOT NULL CHECK (amount_minor > 0),
    currency        text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    reason          text NOT NULL CHECK (reason <> '' AND length(reason) <= 500),
    requested_by    text NOT NULL CHECK (requested_by <> ''),
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'succeeded', 'failed')),
    psp_refund_id   text,
    failure_reason  text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT refunds_key UNIQUE (merchant_id, payment_id, key),
    CONSTRAINT refunds_merchant_id UNIQUE (merchant_id, id),
    CONSTRAINT refunds_payment FOREIGN KEY (merchant_id, payment_id) REFERENCES payments (merchant_id, id),
    CONSTRAINT refunds_settled_has_psp_id CHECK (status <> 'succeeded' OR psp_refund_id IS NOT NULL)
);
-- Pending refunds (a PSP timeout, a crash before the PSP call): what a retry or an operator finds.
CREATE INDEX refunds_pending ON refunds (created_at) WHERE status = 'pending';

-- A refund's status only moves forward: pending -> succeeded | failed.
CREATE FUNCTION refunds_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND OLD.status <> 'pending' THEN
        RAISE EXCEPTION 'refund % may not move from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF (NEW.amount_minor, NEW.payment_id, NEW.merchant_id, NEW.key) IS DISTINCT FROM
       (OLD.amount_minor, OLD.payment_id, OLD.merchant_id, OLD.key) THEN
        RAISE EXCEPTION 'refund % is immutable but for its status', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refunds_forward_only BEFORE UPDATE ON refunds FOR EACH ROW EXECUTE FUNCTION refunds_forward_only();

SELECT cuty_tenant_table('refunds');
