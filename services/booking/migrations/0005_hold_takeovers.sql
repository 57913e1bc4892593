-- HoldSlot reports how many expired holds it took over (issue 15: booking's "expired holds taken
-- over" metric). The same function as in 0001, with one more output column, `taken_over`: the
-- overlapping expired holds that booking_retire_stale marked 'expired' before the INSERT (0 when
-- the sweeper had come first, or on any other outcome).
DROP FUNCTION booking_take_hold(uuid, uuid, text, text, integer, integer, integer);

CREATE FUNCTION booking_take_hold(p_hold_id uuid, p_slot_id uuid, p_customer_id text, p_request_id text,
                                  p_ttl_seconds integer, p_max_active integer, p_max_alternatives integer)
RETURNS TABLE (outcome text, hold holds, alternatives slots[], time_zone text, db_now timestamptz,
              taken_over integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_slot   slots;
    v_active integer;
BEGIN
    -- One customer's HoldSlot calls run one at a time (until commit), so the idempotency lookup
    -- and the active-hold count below cannot be raced by that customer's own parallel calls.
    -- Other customers never wait on it. Under READ COMMITTED every statement below takes a fresh
    -- snapshot, so it sees whatever the previous holder of the lock committed.
    PERFORM pg_advisory_xact_lock(hashtextextended('booking.customer:' || p_customer_id, 0));

    SELECT h.* INTO hold FROM holds h WHERE h.customer_id = p_customer_id AND h.request_id = p_request_id;
    IF FOUND THEN
        outcome := CASE WHEN hold.slot_id = p_slot_id THEN 'existing' ELSE 'request_reused' END;
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;
    hold := NULL;

    SELECT s.* INTO v_slot FROM slots s WHERE s.id = p_slot_id;
    IF NOT FOUND THEN
        outcome := 'slot_not_found';
    ELSIF v_slot.start_time <= clock_timestamp() THEN
        outcome := 'slot_started';
    ELSE
        SELECT count(*) INTO v_active FROM holds h
         WHERE h.customer_id = p_customer_id AND h.status = 'held' AND h.expires_at > clock_timestamp();
        IF v_active >= p_max_active THEN
            outcome := 'cap';
        END IF;
    END IF;
    IF outcome IS NOT NULL THEN
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;

    -- An expired hold that nobody swept yet still counts for the constraint: retire it first.
    -- Rows this transaction has updated are invisible to the constraint check of the INSERT.
    taken_over := booking_retire_stale(v_slot.resource_id, v_slot.start_time, v_slot.end_time);

    INSERT INTO holds (id, slot_id, salon_id, resource_id, customer_id, request_id,
                       start_time, end_time, price_minor, currency, expires_at)
    VALUES (p_hold_id, v_slot.id, v_slot.salon_id, v_slot.resource_id, p_customer_id, p_request_id,
            v_slot.start_time, v_slot.end_time, v_slot.price_minor, v_slot.currency,
            clock_timestamp() + make_interval(secs => p_ttl_seconds))
    ON CONFLICT DO NOTHING
    RETURNING * INTO hold;
    db_now := clock_timestamp();
    IF FOUND THEN
        outcome := 'held';
        RETURN NEXT;
        RETURN;
    END IF;

    -- Lost. Offer the nearest free slots of the same length: the same resource first, then the
    -- salon's other resources; the same local day first within each; then by distance in time.
    hold := NULL;
    outcome := 'taken';
    SELECT sa.time_zone INTO time_zone FROM salons sa WHERE sa.id = v_slot.salon_id;
    alternatives := ARRAY(
        SELECT s FROM slots s
         WHERE s.salon_id = v_slot.salon_id
           AND s.id <> v_slot.id
           AND s.start_time > db_now
           -- a bounded window keeps the loser's answer cheap however long the calendar is
           AND s.start_time BETWEEN v_slot.start_time - interval '7 days' AND v_slot.start_time + interval '7 days'
           AND s.end_time - s.start_time = v_slot.end_time - v_slot.start_time
           AND NOT EXISTS (SELECT 1 FROM holds h
                            WHERE h.resource_id = s.resource_id
                              AND h.status IN ('held', 'confirmed')
                              AND h.during && tstzrange(s.start_time, s.end_time)
                              AND (h.status = 'confirmed' OR h.expires_at > db_now))
         ORDER BY s.resource_id <> v_slot.resource_id,
                  (s.start_time AT TIME ZONE time_zone)::date <> (v_slot.start_time AT TIME ZONE time_zone)::date,
                  abs(extract(epoch FROM s.start_time - v_slot.start_time)),
                  s.start_time, s.id
         LIMIT p_max_alternatives);
    RETURN NEXT;
END
$$;
