-- The slot of a service at p_start on p_resource_id (NULL: any able resource), made on first use
-- (docs/booking.md, "Service slots"). Outcomes: 'ok' (p_id's new slot or the existing one),
-- 'service_not_found', 'resource_not_able' (not a resource of the service), 'off_grid' (a start
-- not on the salon's grid of time_step_minutes, counted from local midnight). Whether the time is
-- free, within working hours, notice and horizon is decided by the hold, not here: a slot is only
-- a name for (service, resource or any, start) that a checkout can carry.
-- Two callers making the same slot at once: the unique key makes one insert win; the other's
-- INSERT waits for it, does nothing, and its next statement (a fresh snapshot) reads the winner's.
CREATE OR REPLACE FUNCTION booking_service_slot(p_id uuid, p_merchant_id text, p_service_id uuid,
                                                p_resource_id uuid, p_start timestamptz)
RETURNS TABLE (outcome text, slot slots, time_zone text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_sv  services;
    v_min numeric;
BEGIN
    SELECT s.* INTO v_sv FROM services s
     WHERE s.id = p_service_id AND (p_merchant_id IS NULL OR s.merchant_id = p_merchant_id);
    IF NOT FOUND THEN
        outcome := 'service_not_found';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT sa.time_zone INTO time_zone FROM salons sa WHERE sa.merchant_id = v_sv.merchant_id AND sa.id = v_sv.salon_id;
    IF p_resource_id IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM service_resources sr
             WHERE sr.merchant_id = v_sv.merchant_id AND sr.service_id = v_sv.id AND sr.resource_id = p_resource_id) THEN
        outcome := 'resource_not_able';
        RETURN NEXT;
        RETURN;
    END IF;
    v_min := extract(epoch FROM (p_start AT TIME ZONE time_zone)::time) / 60;
    IF v_min <> floor(v_min) OR mod(v_min::integer, (SELECT sa.time_step_minutes FROM salons sa
                                                     WHERE sa.merchant_id = v_sv.merchant_id AND sa.id = v_sv.salon_id)) <> 0 THEN
        outcome := 'off_grid';
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO slots (id, merchant_id, salon_id, resource_id, service_id, start_time, end_time, price_minor, currency)
    VALUES (p_id, v_sv.merchant_id, v_sv.salon_id, p_resource_id, v_sv.id, p_start,
            p_start + v_sv.duration_minutes * interval '1 minute', v_sv.price_minor, v_sv.currency)
    ON CONFLICT DO NOTHING
    RETURNING * INTO slot;
    IF NOT FOUND THEN
        SELECT s.* INTO slot FROM slots s
         WHERE s.merchant_id = v_sv.merchant_id AND s.resource_id IS NOT DISTINCT FROM p_resource_id
           AND s.start_time = p_start AND s.end_time = p_start + v_sv.duration_minutes * interval '1 minute'
           AND s.service_id = v_sv.id;
    END IF;
    outcome := 'ok';
    RETURN NEXT;
END
$$;
