-- Issue 12, item 1: cancellation after purchase (docs/checkout.md, "Cancel after purchase").
--
-- A COMPLETED booking may be cancelled by its customer (refund per the salon's cancellation policy,
-- copied from the hold at purchase) or by the merchant's staff (full refund, with a reason):
-- COMPLETED -> CANCELLING (the refund, then booking's CancelBooking frees the slot) ->
-- CANCELLED_AFTER_PURCHASE; a CANCELLING step that keeps failing goes to NEEDS_ATTENTION like the
-- other finishing steps, and an operator's retry puts it back to CANCELLING.

ALTER TABLE checkouts DROP CONSTRAINT checkouts_state_check;
ALTER TABLE checkouts ADD CONSTRAINT checkouts_state_check CHECK (state IN (
    'PENDING', 'HELD', 'CHARGING', 'AWAITING_ACTION', 'CONFIRMING', 'COMPLETED', 'RELEASING',
    'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDING', 'REFUNDED', 'NEEDS_ATTENTION',
    'CANCELLING', 'CANCELLED_AFTER_PURCHASE'));
ALTER TABLE checkouts DROP CONSTRAINT checkouts_attention_from_check;
ALTER TABLE checkouts ADD CONSTRAINT checkouts_attention_from_check
    CHECK (attention_from IN ('CONFIRMING', 'RELEASING', 'REFUNDING', 'CANCELLING'));

-- The booking's cancellation policy and start, recorded with the hold (the TRANSITION to HELD),
-- so the policy shown at purchase is the one applied even if the salon changes it later. NULL for
-- code purchases and for checkouts held before this migration (their cancel uses the defaults of
-- docs/booking.md: 24 hours, 0 %; their start is asked of nobody: see below).
ALTER TABLE checkouts
    ADD COLUMN free_cancellation_hours integer CHECK (free_cancellation_hours >= 0),
    ADD COLUMN cancellation_fee_percent integer CHECK (cancellation_fee_percent BETWEEN 0 AND 100),
    ADD COLUMN start_time timestamptz,
    -- Decided by the statement that starts the cancel (database clock), never changed after.
    ADD COLUMN refund_amount_minor bigint CHECK (refund_amount_minor >= 0),
    ADD COLUMN cancelled_by text,
    ADD COLUMN cancel_reason text,
    ADD CONSTRAINT checkouts_cancel_whole CHECK (
        (refund_amount_minor IS NULL) = (cancelled_by IS NULL)
        AND (state NOT IN ('CANCELLING', 'CANCELLED_AFTER_PURCHASE') OR refund_amount_minor IS NOT NULL));

-- The trigger as 0101 left it, with the two new transitions.
CREATE OR REPLACE FUNCTION checkouts_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version <> OLD.version AND NEW.version <> OLD.version + 1 THEN
        RAISE EXCEPTION 'checkout % version must rise by one, % -> %', OLD.id, OLD.version, NEW.version
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NEW.version <> OLD.version + 1 THEN
            RAISE EXCEPTION 'checkout % state change without a version bump', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NOT (
            (OLD.state = 'PENDING' AND NEW.state IN ('HELD', 'REJECTED'))
            OR (OLD.state = 'HELD' AND NEW.state IN ('CHARGING', 'RELEASING'))
            OR (OLD.state = 'CHARGING' AND NEW.state IN ('AWAITING_ACTION', 'CONFIRMING', 'RELEASING'))
            OR (OLD.state = 'AWAITING_ACTION' AND NEW.state IN ('CHARGING', 'CONFIRMING', 'RELEASING'))
            OR (OLD.state = 'CONFIRMING' AND NEW.state IN ('COMPLETED', 'REFUNDING', 'NEEDS_ATTENTION'))
            OR (OLD.state = 'RELEASING' AND NEW.state IN ('FAILED', 'EXPIRED', 'CANCELLED', 'CONFIRMING', 'REFUNDING',
                                                          'NEEDS_ATTENTION'))
            OR (OLD.state = 'REFUNDING' AND NEW.state IN ('REFUNDED', 'NEEDS_ATTENTION'))
            -- issue 12: a completed booking cancelled after purchase (refund per its policy, then the slot)
            OR (OLD.state = 'COMPLETED' AND NEW.state IN ('CANCELLING'))
            OR (OLD.state = 'CANCELLING' AND NEW.state IN ('CANCELLED_AFTER_PURCHASE', 'NEEDS_ATTENTION'))
            -- an operator's retry: back to the step that kept failing
            OR (OLD.state = 'NEEDS_ATTENTION' AND NEW.state = OLD.attention_from)
        ) THEN
            RAISE EXCEPTION 'checkout % may not move from % to %', OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF OLD.payment_key IS NOT NULL AND NEW.payment_key IS DISTINCT FROM OLD.payment_key THEN
        RAISE EXCEPTION 'checkout % payment attempt may not change', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.payment_id IS NOT NULL AND NEW.payment_id IS DISTINCT FROM OLD.payment_id THEN
        RAISE EXCEPTION 'checkout % payment may not change', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;


-- A payment change wakes its saga (0103), except a saga with nothing left to do: now also
-- CANCELLED_AFTER_PURCHASE (a later refund by staff must not queue a finished saga).
CREATE OR REPLACE FUNCTION checkouts_wake_on_payment() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    leased boolean;
BEGIN
    UPDATE checkouts c SET
        payment_id = COALESCE(c.payment_id, NEW.id),
        wakeup = (c.lease_until IS NOT NULL AND c.lease_until > clock_timestamp()),
        next_run_at = CASE WHEN c.lease_until IS NOT NULL AND c.lease_until > clock_timestamp()
                           THEN c.next_run_at ELSE clock_timestamp() END
    WHERE c.id = NEW.checkout_id
      AND c.state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED', 'NEEDS_ATTENTION',
                            'CANCELLED_AFTER_PURCHASE')
      AND c.payment_key IS NOT NULL
      AND (c.payment_id IS NULL OR c.payment_id = NEW.id)
    RETURNING c.wakeup INTO leased;
    IF FOUND AND NOT leased THEN
        PERFORM pg_notify('cuty_checkout_wake', NEW.checkout_id::text);
    END IF;
    RETURN NULL;
END $$;

-- The "stuck sagas" index (0101_checkout_traces) over the live rows only: a booking cancelled after
-- purchase is finished too (payments/metrics.py NON_TERMINAL, ops.py STUCK say the same).
DROP INDEX checkouts_live_by_state;
CREATE INDEX checkouts_live_by_state ON checkouts (state, updated_at)
    WHERE state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED',
                        'CANCELLED_AFTER_PURCHASE');
