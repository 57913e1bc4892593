-- HoldSlot in one round trip (docs/booking.md). Outcomes:
--   'held'           a new hold (the INSERT won against holds_no_overlap)
--   'existing'       this (customer, request id) already has a hold: returned as it is now
--   'request_reused' the request id was used for another slot
--   'slot_not_found', 'slot_started', 'cap' (too many active holds)
--   'taken'          the time is held or booked: up to p_max_alternatives free slots instead
-- The race for the time is decided by the INSERT ... ON CONFLICT DO NOTHING against the exclusion
-- constraint; nothing here reads-then-writes to protect it.
-- The slot is read first and the request id is looked up within its merchant (the idempotency key
-- is (merchant_id, customer_id, request_id)); the hold gets the slot's merchant and its salon's
-- cancellation policy. A retry still answers 'existing' after the slot has started (the lookup
-- comes before that check), and the per-customer lock and cap span every merchant (customers are
-- global). `taken_over`: the overlapping expired holds that booking_retire_stale marked 'expired'
-- before the INSERT (booking's "expired holds taken over" metric; 0 when the sweeper had come
-- first, or on any other outcome).
-- It acts for every merchant (SET cuty.merchant = '*', for the call only): the orchestrator and
-- customers hold any merchant's slot, and saying so here keeps HoldSlot at one round trip behind
-- PgBouncer (docs/tenancy.md). A merchant's user reaches it only after BookingService.hold_slot
-- checked that the slot is that merchant's.
CREATE OR REPLACE FUNCTION booking_take_hold(p_hold_id uuid, p_slot_id uuid, p_customer_id text, p_request_id text,
                                  p_ttl_seconds integer, p_max_active integer, p_max_alternatives integer)
RETURNS TABLE (outcome text, hold holds, alternatives slots[], time_zone text, db_now timestamptz,
              taken_over integer)
LANGUAGE plpgsql SET cuty.merchant = '*' AS $$
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

    -- A slot is never deleted and never changes merchant, so reading it first is safe.
    SELECT s.* INTO v_slot FROM slots s WHERE s.id = p_slot_id;
    IF NOT FOUND THEN
        outcome := 'slot_not_found';
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;

    SELECT h.* INTO hold FROM holds h
     WHERE h.merchant_id = v_slot.merchant_id AND h.customer_id = p_customer_id AND h.request_id = p_request_id;
    IF FOUND THEN
        outcome := CASE WHEN hold.slot_id = p_slot_id THEN 'existing' ELSE 'request_reused' END;
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;
    hold := NULL;

    IF v_slot.start_time <= clock_timestamp() THEN
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
    taken_over := booking_retire_stale(v_slot.merchant_id, v_slot.resource_id, v_slot.start_time, v_slot.end_time);

    -- The salon's cancellation policy as it is now goes with the hold (the salon is read
    -- in the same statement, by its key): the policy shown at purchase is the one applied later.
    INSERT INTO holds (id, merchant_id, slot_id, salon_id, resource_id, customer_id, request_id,
                       start_time, end_time, price_minor, currency, expires_at,
                       free_cancellation_hours, cancellation_fee_percent)
    SELECT p_hold_id, v_slot.merchant_id, v_slot.id, v_slot.salon_id, v_slot.resource_id, p_customer_id,
           p_request_id, v_slot.start_time, v_slot.end_time, v_slot.price_minor, v_slot.currency,
           clock_timestamp() + make_interval(secs => p_ttl_seconds),
           sa.free_cancellation_hours, sa.cancellation_fee_percent
      FROM salons sa
     WHERE sa.merchant_id = v_slot.merchant_id AND sa.id = v_slot.salon_id
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
    SELECT sa.time_zone INTO time_zone FROM salons sa
     WHERE sa.merchant_id = v_slot.merchant_id AND sa.id = v_slot.salon_id;
    alternatives := ARRAY(
        SELECT s FROM slots s
         WHERE s.merchant_id = v_slot.merchant_id
           AND s.salon_id = v_slot.salon_id
           AND s.id <> v_slot.id
           AND s.start_time > db_now
           -- a bounded window keeps the loser's answer cheap however long the calendar is
           AND s.start_time BETWEEN v_slot.start_time - interval '7 days' AND v_slot.start_time + interval '7 days'
           AND s.end_time - s.start_time = v_slot.end_time - v_slot.start_time
           -- OFFSET 0 keeps this a per-slot probe of holds_no_overlap on all three of its columns.
           -- As a join, the planner may derive h.merchant_id = (the slot's merchant) and, when its
           -- statistics lag behind a table filling fast, scan all of the merchant's holds once per slot.
           AND NOT EXISTS (SELECT 1 FROM holds h
                            WHERE h.merchant_id = s.merchant_id
                              AND h.resource_id = s.resource_id
                              AND h.status IN ('held', 'confirmed')
                              AND h.during && tstzrange(s.start_time, s.end_time)
                              AND (h.status = 'confirmed' OR h.expires_at > db_now)
                           OFFSET 0)
         ORDER BY s.resource_id <> v_slot.resource_id,
                  (s.start_time AT TIME ZONE time_zone)::date <> (v_slot.start_time AT TIME ZONE time_zone)::date,
                  abs(extract(epoch FROM s.start_time - v_slot.start_time)),
                  s.start_time, s.id
         LIMIT p_max_alternatives);
    RETURN NEXT;
END
$$;
