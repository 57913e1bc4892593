-- ConfirmHold in one round trip. Outcomes: 'confirmed' (also on a retry with the same payment
-- ref), 'reacquired' (it had expired but its time was still free), 'lost' (expired and the time
-- is someone else's now), 'released', 'payment_ref_mismatch', 'not_found', and 'started': a late
-- payment never confirms an appointment that has started, or starts within p_cutoff_seconds
-- (CUTY_CONFIRM_CUTOFF_SECONDS; FAILED_PRECONDITION slot-started, the orchestrator refunds, as for
-- 'lost'). A hold confirmed already stays confirmed: a repeat with its payment ref still answers
-- 'confirmed'. p_cutoff_seconds defaults to 0, so a caller of the two-argument form keeps working.
-- The orchestrator's alone (system), for every merchant: SET cuty.merchant = '*' for the call, so
-- ConfirmHold stays one round trip behind PgBouncer (docs/tenancy.md).
CREATE OR REPLACE FUNCTION booking_confirm_hold(p_hold_id uuid, p_payment_ref text, p_cutoff_seconds double precision DEFAULT 0)
RETURNS TABLE (outcome text, hold holds, db_now timestamptz)
LANGUAGE plpgsql SET cuty.merchant = '*' AS $$
#variable_conflict use_column
BEGIN
    FOR attempt IN 1..3 LOOP
        -- A 'held' row is in the constraint's index whether or not its time ran out, so nobody
        -- else can hold that time: confirming it is safe even when it expired a moment ago.
        -- A held hold said so that only the primary key serves it (booking/repository.py, HELD).
        UPDATE holds h SET status = 'confirmed', payment_ref = p_payment_ref, updated_at = clock_timestamp()
         WHERE h.id = p_hold_id AND h.status IN ('held', 'confirmed') AND h.status <> 'confirmed'
           AND h.start_time > clock_timestamp() + make_interval(secs => p_cutoff_seconds)
        RETURNING h.* INTO hold;
        IF FOUND THEN
            outcome := 'confirmed';
            EXIT;
        END IF;
        SELECT h.* INTO hold FROM holds h WHERE h.id = p_hold_id;
        IF NOT FOUND THEN
            outcome := 'not_found';
            hold := NULL;
            EXIT;
        ELSIF hold.status = 'confirmed' THEN
            outcome := CASE WHEN hold.payment_ref = p_payment_ref THEN 'confirmed' ELSE 'payment_ref_mismatch' END;
            EXIT;
        ELSIF hold.status = 'released' THEN
            outcome := 'released';
            EXIT;
        ELSIF hold.start_time <= clock_timestamp() + make_interval(secs => p_cutoff_seconds) THEN
            -- held or expired, and too late: the appointment has started (or is about to)
            outcome := 'started';
            EXIT;
        ELSIF hold.status = 'expired' THEN
            -- Re-acquire: the exclusion constraint decides whether the time is still free.
            PERFORM booking_retire_stale(hold.merchant_id, hold.resource_id, lower(hold.during), upper(hold.during), hold.id);
            BEGIN
                UPDATE holds h SET status = 'confirmed', payment_ref = p_payment_ref, updated_at = clock_timestamp()
                 WHERE h.id = p_hold_id AND h.status = 'expired'
                   AND h.start_time > clock_timestamp() + make_interval(secs => p_cutoff_seconds)
                RETURNING h.* INTO hold;
                IF FOUND THEN
                    outcome := 'reacquired';
                    EXIT;
                END IF;
            EXCEPTION WHEN exclusion_violation THEN
                outcome := 'lost';
                EXIT;
            END;
        END IF;
        -- the row changed between our statements (a concurrent confirm or takeover): look again
    END LOOP;
    IF outcome IS NULL THEN
        RAISE EXCEPTION 'hold % kept changing under confirm', p_hold_id USING ERRCODE = 'serialization_failure';
    END IF;
    db_now := clock_timestamp();
    RETURN NEXT;
END
$$;
