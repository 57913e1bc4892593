-- A service slot's loser's alternatives (docs/booking.md, "Any free stylist"): up to p_max free
-- times of the same service within two days either side, from booking_service_times, as service
-- slots (made on first use). A named resource's loser is offered that resource first (the same
-- time on another resource is an alternative too), an "any" loser any-resource slots; then the
-- same local day first, then the nearest in time, earlier first on ties (as for plain slots).
CREATE OR REPLACE FUNCTION booking_service_alternatives(p_slot slots, p_max integer) RETURNS slots[]
LANGUAGE plpgsql AS $$
DECLARE
    v_tz  text;
    v_out slots[] := '{}';
    v_s   slots;
    r     record;
BEGIN
    SELECT sa.time_zone INTO v_tz FROM salons sa WHERE sa.merchant_id = p_slot.merchant_id AND sa.id = p_slot.salon_id;
    FOR r IN SELECT t.start_time, t.resource_ids,
                    CASE WHEN p_slot.resource_id IS NULL THEN NULL
                         WHEN p_slot.resource_id = ANY (t.resource_ids) THEN p_slot.resource_id
                         ELSE t.resource_ids[1] END AS resource_id
               FROM booking_service_times(p_slot.merchant_id, p_slot.service_id, NULL,
                                          p_slot.start_time - interval '2 days', p_slot.start_time + interval '2 days') t
              WHERE t.start_time <> p_slot.start_time
                 OR (p_slot.resource_id IS NOT NULL AND t.resource_ids <> ARRAY[p_slot.resource_id])
              ORDER BY p_slot.resource_id IS NOT NULL AND NOT (p_slot.resource_id = ANY (t.resource_ids)),
                       (t.start_time AT TIME ZONE v_tz)::date <> (p_slot.start_time AT TIME ZONE v_tz)::date,
                       abs(extract(epoch FROM t.start_time - p_slot.start_time)), t.start_time
              LIMIT p_max
    LOOP
        IF r.start_time = p_slot.start_time AND r.resource_id = p_slot.resource_id THEN
            r.resource_id := (SELECT x FROM unnest(r.resource_ids) x WHERE x <> p_slot.resource_id LIMIT 1);
        END IF;
        SELECT (s.slot).* INTO v_s FROM booking_service_slot(gen_random_uuid(), p_slot.merchant_id, p_slot.service_id,
                                                         r.resource_id, r.start_time) s;
        v_out := v_out || v_s;
    END LOOP;
    RETURN v_out;
END
$$;
