-- Issue 10, item 8: a step that keeps failing (a refund or cancel the PSP keeps refusing, an
-- unexpected answer from booking or the code pool) no longer retries forever. After
-- CUTY_SAGA_MAX_ATTEMPTS attempts or CUTY_SAGA_ATTENTION_AFTER_SECONDS of failing, a saga in
-- CONFIRMING, RELEASING or REFUNDING moves to NEEDS_ATTENTION: kept (never dropped), off the
-- worker queue, visible to staff, counted, and put back into the state it left by an operator
-- (RetryCheckout). docs/checkout.md, "Needs attention".

ALTER TABLE checkouts DROP CONSTRAINT checkouts_state_check;
ALTER TABLE checkouts ADD CONSTRAINT checkouts_state_check CHECK (state IN (
    'PENDING', 'HELD', 'CHARGING', 'AWAITING_ACTION', 'CONFIRMING', 'COMPLETED', 'RELEASING',
    'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDING', 'REFUNDED', 'NEEDS_ATTENTION'));

-- When the current step first failed (NULL: it has not); reset by every transition.
ALTER TABLE checkouts ADD COLUMN failing_since timestamptz;
-- The state a NEEDS_ATTENTION saga left, which an operator's retry returns it to.
ALTER TABLE checkouts ADD COLUMN attention_from text
    CHECK (attention_from IN ('CONFIRMING', 'RELEASING', 'REFUNDING'));
ALTER TABLE checkouts ADD CONSTRAINT checkouts_attention_whole CHECK (
    (state = 'NEEDS_ATTENTION') = (attention_from IS NOT NULL));
-- Waiting for a human: no worker picks it up.
ALTER TABLE checkouts ADD CONSTRAINT checkouts_attention_idle CHECK (
    state <> 'NEEDS_ATTENTION' OR (next_run_at IS NULL AND lease_owner IS NULL));

-- Staff look for these; few rows, so a small partial index.
CREATE INDEX checkouts_needing_attention ON checkouts (updated_at) WHERE state = 'NEEDS_ATTENTION';

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
