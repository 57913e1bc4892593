-- A hold of a service slot (docs/booking.md, "Any free stylist"): on the slot's resource, or, for
-- a slot of any resource, on one able resource free for the service's whole blocked range
-- (buffers included) and working through all of it. The choice and the insert are ONE statement,
-- `INSERT ... SELECT ... LIMIT 1 ON CONFLICT DO NOTHING`, decided by holds_no_overlap: no
-- resource is read as free and then written. Fairly: the resource with the fewest live holds and
-- bookings on the salon's local day first, ties broken by a hash of the new hold's id (so racers
-- spread over equally loaded resources instead of all trying the same one first).
-- Racers do not queue behind each other: an INSERT that overlaps another transaction's uncommitted
-- hold waits for that commit (and then loses), so the pick skips a resource that a concurrent
-- any-resource hold is taking at this start right now. It takes the first free resource, in the
-- fair order, whose transaction-scoped advisory lock on (resource, start) it gets without waiting
-- (pg_try_advisory_xact_lock, a SKIP LOCKED for the exclusion constraint). The lock decides
-- nothing: the constraint still does (a named hold takes no such lock, and a hold at an overlapping
-- but different start has another key; either makes the INSERT wait and lose as before). Only
-- when every free resource is being taken by someone else does it pick without the lock and let
-- the constraint make it wait, since those racers may yet fail.
-- A racer whose pick was taken by a concurrent insert (its insert waited, then did nothing) tries
-- again with a fresh snapshot, where that hold is visible: at most once per able resource, plus
-- once after falling back to waiting. NULL when no able resource is free. Expired holds still marked 'held' on the able resources are
-- retired first (booking_retire_stale_among), so they never block.
-- The hold copies the service's price and buffers and the salon's cancellation policy.
CREATE OR REPLACE FUNCTION booking_take_service_hold(p_hold_id uuid, p_slot slots, p_customer_id text,
                                                     p_request_id text, p_expires_at timestamptz, p_offered boolean)
RETURNS holds
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_sv    services;
    v_sa    salons;
    v_block tstzrange;
    v_day   tstzrange;
    v_local date;
    v_ids   uuid[];
    v_pick  uuid;
    v_id    uuid;
    v_free  integer;
    v_wait  boolean := false;
    v_key   integer;
    v_hold  holds;
BEGIN
    SELECT s.* INTO v_sv FROM services s WHERE s.merchant_id = p_slot.merchant_id AND s.id = p_slot.service_id;
    SELECT sa.* INTO v_sa FROM salons sa WHERE sa.merchant_id = p_slot.merchant_id AND sa.id = p_slot.salon_id;
    v_block := booking_blocked_range(p_slot.start_time, p_slot.end_time, v_sv.buffer_before_minutes,
                                     v_sv.buffer_after_minutes);
    v_local := (p_slot.start_time AT TIME ZONE v_sa.time_zone)::date;
    v_day := tstzrange(v_local::timestamp AT TIME ZONE v_sa.time_zone, (v_local + 1)::timestamp AT TIME ZONE v_sa.time_zone);

    -- The able resources (just the slot's, if it names one) that work through the whole range.
    SELECT array_agg(w.resource_id) INTO v_ids FROM (
        SELECT w.resource_id
          FROM booking_working_ranges(p_slot.merchant_id, p_slot.salon_id,
                   ARRAY(SELECT sr.resource_id FROM service_resources sr
                          WHERE sr.merchant_id = p_slot.merchant_id AND sr.service_id = p_slot.service_id
                            AND (p_slot.resource_id IS NULL OR sr.resource_id = p_slot.resource_id)),
                   (lower(v_block) AT TIME ZONE v_sa.time_zone)::date - 1,
                   (upper(v_block) AT TIME ZONE v_sa.time_zone)::date) w
         GROUP BY w.resource_id
        HAVING range_agg(w.during) @> v_block) w;
    IF v_ids IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM booking_retire_stale_among(p_slot.merchant_id, v_ids, lower(v_block), upper(v_block));

    -- minutes since the epoch: the second key of the (resource, start) lock
    v_key := floor(extract(epoch FROM p_slot.start_time) / 60)::integer;
    FOR i IN 1 .. array_length(v_ids, 1) + 1 LOOP
        WITH free AS MATERIALIZED (
            -- the free able resources in the fair order (OFFSET 0: sorted here, before the lock)
            SELECT c.rid FROM unnest(v_ids) c(rid)
             WHERE NOT EXISTS (SELECT 1 FROM holds h
                                WHERE h.merchant_id = p_slot.merchant_id AND h.resource_id = c.rid
                                  AND h.status IN ('held', 'confirmed') AND h.during && v_block
                                  -- the same, leakproof, for the index under RLS (0170_holds_live_times.sql)
                                  AND h.start_time < upper(v_block) + interval '240 minutes'
                                  AND h.end_time > lower(v_block) - interval '240 minutes')
             ORDER BY (SELECT count(*) FROM holds h
                        WHERE h.merchant_id = p_slot.merchant_id AND h.resource_id = c.rid
                          AND h.status IN ('held', 'confirmed') AND h.during && v_day
                          AND h.start_time < upper(v_day) + interval '240 minutes'
                          AND h.end_time > lower(v_day) - interval '240 minutes'
                          AND (h.status = 'confirmed' OR h.expires_at > clock_timestamp())),
                      hashtext(p_hold_id::text || c.rid::text)
            OFFSET 0
        ), pick AS (
            -- the first of them in that order that nobody is taking at this start right now: the
            -- lock is tried row by row as the ordered rows come, and LIMIT stops at the first got
            SELECT f.rid FROM free f
             WHERE v_wait OR pg_try_advisory_xact_lock(hashtext(f.rid::text), v_key)
             LIMIT 1
        ), ins AS (
            INSERT INTO holds (id, merchant_id, slot_id, salon_id, resource_id, customer_id, request_id,
                               start_time, end_time, price_minor, currency, expires_at,
                               free_cancellation_hours, cancellation_fee_percent,
                               service_id, buffer_before_minutes, buffer_after_minutes, offered)
            SELECT p_hold_id, p_slot.merchant_id, p_slot.id, p_slot.salon_id, pick.rid, p_customer_id, p_request_id,
                   p_slot.start_time, p_slot.end_time, v_sv.price_minor, v_sv.currency, p_expires_at,
                   v_sa.free_cancellation_hours, v_sa.cancellation_fee_percent,
                   v_sv.id, v_sv.buffer_before_minutes, v_sv.buffer_after_minutes, p_offered
              FROM pick
            ON CONFLICT DO NOTHING
            RETURNING *
        )
        SELECT (SELECT pick.rid FROM pick), (SELECT ins.id FROM ins), (SELECT count(*) FROM free)
          INTO v_pick, v_id, v_free;
        IF v_id IS NOT NULL THEN
            SELECT h.* INTO v_hold FROM holds h WHERE h.id = v_id;
            RETURN v_hold;
        END IF;
        EXIT WHEN v_free = 0;  -- nobody free
        -- every free one is being taken by others: wait for the constraint from now on; else the
        -- pick was taken meanwhile: again, with a fresh snapshot
        v_wait := v_wait OR v_pick IS NULL;
    END LOOP;
    RETURN NULL;
END
$$;
