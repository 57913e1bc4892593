-- The saga's transition table, as in payments/checkout/domain.py, so a wrong move is refused by
-- the database whatever code wrote it; a state change must bump the version by exactly one, and the
-- payment attempt and the payment of a checkout, once set, never change. One reschedule at a time
-- per checkout: it is a state of the row, entered only from COMPLETED. PENDING -> CHARGING only
-- with the facts of both moves it stands for (domain.ONE_CALL_START); CHARGING -> COMPLETED only
-- with the checkout's payment captured (domain.CAPTURED_COMPLETION).
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
            -- a customer's one-call checkout: its hold recorded with its payment's start, never
            -- without both (the hold's price and expiry, the payment attempt of its own method)
            OR (OLD.state = 'PENDING' AND NEW.state = 'CHARGING' AND NEW.payment_method IS NOT NULL
                AND NEW.payment_key IS NOT NULL AND NEW.amount_minor IS NOT NULL AND NEW.expire_time IS NOT NULL
                AND NEW.settle IS NULL AND NEW.created_by IS NULL)
            OR (OLD.state = 'HELD' AND NEW.state IN ('CHARGING', 'RELEASING'))
            OR (OLD.state = 'CHARGING' AND NEW.state IN ('AWAITING_ACTION', 'CONFIRMING', 'RELEASING'))
            -- the synchronous capture recorded with the confirm: never without the payment captured
            OR (OLD.state = 'CHARGING' AND NEW.state = 'COMPLETED' AND NEW.payment_id IS NOT NULL
                AND EXISTS (SELECT 1 FROM payments p WHERE p.id = NEW.payment_id AND p.checkout_id = NEW.id
                            AND p.status IN ('succeeded', 'partially_refunded')))
            OR (OLD.state = 'AWAITING_ACTION' AND NEW.state IN ('CHARGING', 'CONFIRMING', 'RELEASING'))
            OR (OLD.state = 'CONFIRMING' AND NEW.state IN ('COMPLETED', 'REFUNDING', 'NEEDS_ATTENTION'))
            OR (OLD.state = 'RELEASING' AND NEW.state IN ('FAILED', 'EXPIRED', 'CANCELLED', 'CONFIRMING', 'REFUNDING',
                                                          'NEEDS_ATTENTION'))
            OR (OLD.state = 'REFUNDING' AND NEW.state IN ('REFUNDED', 'NEEDS_ATTENTION'))
            -- a completed booking cancelled after purchase (refund per its policy, then the slot)
            -- or rescheduled (the new slot held, paid, confirmed; then the old one released)
            OR (OLD.state = 'COMPLETED' AND NEW.state IN ('CANCELLING', 'RESCHEDULING'))
            OR (OLD.state = 'CANCELLING' AND NEW.state IN ('CANCELLED_AFTER_PURCHASE', 'NEEDS_ATTENTION'))
            OR (OLD.state = 'RESCHEDULING' AND NEW.state IN ('RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING',
                                                             'COMPLETED', 'NEEDS_ATTENTION'))
            OR (OLD.state = 'RESCHEDULE_CONFIRMING' AND NEW.state IN ('COMPLETED', 'RESCHEDULE_REVERTING',
                                                                      'NEEDS_ATTENTION'))
            OR (OLD.state = 'RESCHEDULE_REVERTING' AND NEW.state IN ('COMPLETED', 'NEEDS_ATTENTION'))
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
