-- The signature grew (p_offer_seconds, offer): the older one goes.
DROP FUNCTION IF EXISTS booking_take_hold(uuid, uuid, text, text, integer, integer, integer);
-- HoldSlot in one round trip (docs/booking.md). Outcomes:
--   'held'           a new hold (the INSERT won against holds_no_overlap)
--   'existing'       this (customer, request id) already has a hold: returned as it is now
--   'request_reused' the request id was used for another slot
--   'slot_not_found', 'slot_started', 'cap' (too many active holds)
--   'taken'          the time is held or booked: up to p_max_alternatives free slots instead, and
--                    with p_offer_seconds > 0 the first of them that could be held is held for the
--                    customer for that long (`offer`, a short hold counted in their cap): the
--                    race loser is kept (docs/booking.md, "The race loser is kept")
--   'adopted'        the customer's own offered hold of this slot, now theirs under p_request_id
--                    for p_ttl_seconds (accepting the offer)
--   'outside_window' a service slot before the salon's minimum notice or beyond its horizon
-- A service slot (slots.service_id) is held by booking_take_service_hold: on its resource, or on
-- one free able resource chosen in the INSERT itself; a plain slot as before.
-- The race for the time is decided by the INSERT ... ON CONFLICT DO NOTHING against the exclusion
-- constraint; nothing here reads-then-writes to protect it.
-- The slot is read first and the request id is looked up within its merchant (the idempotency key
-- is (merchant_id, customer_id, request_id)); the hold gets the slot's merchant and its salon's
-- cancellation policy. A retry still answers 'existing' after the slot has started (the lookup
-- comes before that check), and the per-customer lock and cap span every merchant (customers are
-- global). `taken_over`: the overlapping expired holds that booking_retire_stale marked 'expired'
-- after the first INSERT met them (booking's "expired holds taken over" metric; 0 when the
-- sweeper had come first, or on any other outcome).
-- It acts for every merchant (SET cuty.merchant = '*', for the call only): the orchestrator and
-- customers hold any merchant's slot, and saying so here keeps HoldSlot at one round trip behind
-- PgBouncer (docs/tenancy.md). A merchant's user reaches it only after BookingService.hold_slot
-- checked that the slot is that merchant's.
CREATE OR REPLACE FUNCTION booking_take_hold(p_hold_id uuid, p_slot_id uuid, p_customer_id text, p_request_id text,
                                  p_ttl_seconds integer, p_max_active integer, p_max_alternatives integer,
                                  p_offer_seconds integer DEFAULT 0)
RETURNS TABLE (outcome text, hold holds, alternatives slots[], time_zone text, db_now timestamptz,
              taken_over integer, offer holds)
LANGUAGE plpgsql SET cuty.merchant = '*' AS $$
#variable_conflict use_column
DECLARE
    v_slot   slots;
    v_active integer;
    v_alt    slots;
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

    -- Accepting an offer: the customer's live offered hold of this very slot becomes the hold of
    -- this request (its time was never free in between). It was counted in the cap already.
    UPDATE holds h SET offered = false, request_id = p_request_id, updated_at = clock_timestamp(),
                       expires_at = clock_timestamp() + make_interval(secs => p_ttl_seconds)
     WHERE h.merchant_id = v_slot.merchant_id AND h.customer_id = p_customer_id AND h.slot_id = p_slot_id
       -- held, said so that the (merchant, customer, request) key serves it (booking/repository.py, HELD)
       AND h.offered AND h.status IN ('held', 'confirmed') AND h.status <> 'confirmed'
       AND h.expires_at > clock_timestamp()
       AND v_slot.start_time > clock_timestamp()
    RETURNING h.* INTO hold;
    IF FOUND THEN
        outcome := 'adopted';
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;
    hold := NULL;

    IF v_slot.start_time <= clock_timestamp() THEN
        outcome := 'slot_started';
    ELSIF v_slot.service_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM salons sa WHERE sa.merchant_id = v_slot.merchant_id AND sa.id = v_slot.salon_id
               AND (v_slot.start_time < clock_timestamp() + sa.min_notice_minutes * interval '1 minute'
                    OR v_slot.start_time > clock_timestamp() + sa.booking_horizon_days * interval '1 day')) THEN
        outcome := 'outside_window';
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

    IF v_slot.service_id IS NOT NULL THEN
        hold := booking_take_service_hold(p_hold_id, v_slot, p_customer_id, p_request_id,
                                          clock_timestamp() + make_interval(secs => p_ttl_seconds), false);
        taken_over := 0;
    ELSE
        taken_over := 0;
        FOR attempt IN 1..2 LOOP
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
            EXIT WHEN hold.id IS NOT NULL OR attempt = 2;
            -- The time is taken, perhaps by an expired hold nobody swept yet (it still counts for
            -- the constraint): retire those and try once more. Only a conflict pays for the
            -- lookup; a free time is won by the INSERT alone. Rows this transaction has updated
            -- are invisible to the constraint check of the second INSERT.
            taken_over := booking_retire_stale(v_slot.merchant_id, v_slot.resource_id, v_slot.start_time, v_slot.end_time);
            EXIT WHEN taken_over = 0;
        END LOOP;
    END IF;
    db_now := clock_timestamp();
    IF hold.id IS NOT NULL THEN
        outcome := 'held';
        RETURN NEXT;
        RETURN;
    END IF;

    -- Lost. Offer the nearest free slots of the same length: the same resource first, then the
    -- salon's other resources; the same local day first within each; then by distance in time.
    -- A service slot's loser: free times of the same service (booking_service_alternatives).
    hold := NULL;
    outcome := 'taken';
    SELECT sa.time_zone INTO time_zone FROM salons sa
     WHERE sa.merchant_id = v_slot.merchant_id AND sa.id = v_slot.salon_id;
    IF v_slot.service_id IS NOT NULL THEN
        alternatives := booking_service_alternatives(v_slot, p_max_alternatives);
    ELSE
        alternatives := ARRAY(
            SELECT s FROM slots s
             WHERE s.merchant_id = v_slot.merchant_id
               AND s.salon_id = v_slot.salon_id
               AND s.service_id IS NULL
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
                                  -- the same, leakproof, for the index under RLS (0170_holds_live_times.sql)
                                  AND h.start_time < s.end_time + interval '240 minutes'
                                  AND h.end_time > s.start_time - interval '240 minutes'
                                  AND (h.status = 'confirmed' OR h.expires_at > db_now)
                               OFFSET 0)
             ORDER BY s.resource_id <> v_slot.resource_id,
                      (s.start_time AT TIME ZONE time_zone)::date <> (v_slot.start_time AT TIME ZONE time_zone)::date,
                      abs(extract(epoch FROM s.start_time - v_slot.start_time)),
                      s.start_time, s.id
             LIMIT p_max_alternatives);
    END IF;

    -- The race loser is kept: the first alternative that can be held is held for them, briefly.
    -- A retry of the same lost request finds the offer it made before (one offer per request).
    IF p_offer_seconds > 0 THEN
        SELECT h.* INTO offer FROM holds h
         WHERE h.merchant_id = v_slot.merchant_id AND h.customer_id = p_customer_id
           AND h.request_id = 'offer:' || p_request_id;
        IF NOT FOUND THEN
            offer := NULL;
            FOREACH v_alt IN ARRAY alternatives LOOP
                IF v_alt.service_id IS NOT NULL THEN
                    offer := booking_take_service_hold(gen_random_uuid(), v_alt, p_customer_id, 'offer:' || p_request_id,
                                                       clock_timestamp() + make_interval(secs => p_offer_seconds), true);
                ELSE
                    FOR attempt IN 1..2 LOOP  -- as the hold above: the INSERT first, stale holds retired on a conflict
                        INSERT INTO holds (id, merchant_id, slot_id, salon_id, resource_id, customer_id, request_id,
                                           start_time, end_time, price_minor, currency, expires_at,
                                           free_cancellation_hours, cancellation_fee_percent, offered)
                        SELECT gen_random_uuid(), v_alt.merchant_id, v_alt.id, v_alt.salon_id, v_alt.resource_id,
                               p_customer_id, 'offer:' || p_request_id, v_alt.start_time, v_alt.end_time,
                               v_alt.price_minor, v_alt.currency, clock_timestamp() + make_interval(secs => p_offer_seconds),
                               sa.free_cancellation_hours, sa.cancellation_fee_percent, true
                          FROM salons sa
                         WHERE sa.merchant_id = v_alt.merchant_id AND sa.id = v_alt.salon_id
                        ON CONFLICT DO NOTHING
                        RETURNING * INTO offer;
                        EXIT WHEN offer.id IS NOT NULL OR attempt = 2;
                        EXIT WHEN booking_retire_stale(v_alt.merchant_id, v_alt.resource_id, v_alt.start_time,
                                                       v_alt.end_time) = 0;
                    END LOOP;
                END IF;
                EXIT WHEN offer.id IS NOT NULL;
            END LOOP;
        END IF;
        db_now := clock_timestamp();
    END IF;
    RETURN NEXT;
END
$$;
