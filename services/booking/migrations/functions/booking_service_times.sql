-- Free start times of a service in [p_from, p_to) (docs/booking.md, "Availability"), each with the
-- able resources free for it (p_resource_id: only that one; NULL: any able resource). Computed,
-- not stored: per resource, its working time (booking_working_ranges) minus the time its live holds
-- and bookings block (buffers included), as multiranges; a start is free when the service's
-- whole blocked range (buffer before, the service, buffer after) lies inside that difference.
-- Starts are on the salon's grid (local wall times a multiple of time_step_minutes after midnight), and
-- respect the salon's minimum notice and booking horizon (database clock).
CREATE OR REPLACE FUNCTION booking_service_times(p_merchant_id text, p_service_id uuid, p_resource_id uuid,
                                                 p_from timestamptz, p_to timestamptz)
RETURNS TABLE (start_time timestamptz, resource_ids uuid[])
LANGUAGE sql STABLE AS $$
    WITH sv AS (
        SELECT s.salon_id, s.duration_minutes, s.buffer_before_minutes, s.buffer_after_minutes, sa.time_zone,
               greatest(p_from, clock_timestamp() + sa.min_notice_minutes * interval '1 minute') AS t_from,
               least(p_to, clock_timestamp() + sa.booking_horizon_days * interval '1 day') AS t_to,
               sa.time_step_minutes * interval '1 minute' AS step, sa.time_step_minutes AS step_minutes, clock_timestamp() AS now
          FROM services s JOIN salons sa ON sa.merchant_id = s.merchant_id AND sa.id = s.salon_id
         WHERE s.merchant_id = p_merchant_id AND s.id = p_service_id
    ), able AS (
        SELECT array_agg(sr.resource_id) AS ids FROM service_resources sr
         WHERE sr.merchant_id = p_merchant_id AND sr.service_id = p_service_id
           AND (p_resource_id IS NULL OR sr.resource_id = p_resource_id)
    ), work AS MATERIALIZED (
        SELECT w.resource_id, w.during
          FROM sv, able, booking_working_ranges(p_merchant_id, sv.salon_id, able.ids,
                                                (sv.t_from AT TIME ZONE sv.time_zone)::date - 1,
                                                (sv.t_to AT TIME ZONE sv.time_zone)::date) w
         WHERE sv.t_from < sv.t_to AND able.ids IS NOT NULL
    ), free AS (
        SELECT wk.resource_id,
               range_agg(wk.during) - coalesce((
                   SELECT range_agg(h.during) FROM holds h
                    WHERE h.merchant_id = p_merchant_id AND h.resource_id = wk.resource_id
                      AND h.status IN ('held', 'confirmed')
                      AND h.during && tstzrange(min(sv.t_from) - interval '1 day', min(sv.t_to) + interval '1 day')
                      AND (h.status = 'confirmed' OR h.expires_at > min(sv.now))), '{}'::tstzmultirange) AS times
          FROM work wk, sv GROUP BY wk.resource_id
    ), starts AS (
        -- the grid: local wall times a multiple of the step after midnight (a whole-hour DST
        -- change keeps real-time steps on it)
        SELECT DISTINCT wk.resource_id, g.first + k * sv.step AS t
          FROM work wk, sv,
               LATERAL (SELECT lower(wk.during) + mod(sv.step_minutes - mod(floor(extract(epoch FROM
                                   (lower(wk.during) AT TIME ZONE sv.time_zone)::time) / 60)::integer,
                                   sv.step_minutes), sv.step_minutes) * interval '1 minute' AS first) g,
               generate_series(0, floor(extract(epoch FROM upper(wk.during) - g.first)
                                        / extract(epoch FROM sv.step))::integer) k
    )
    SELECT st.t, array_agg(st.resource_id ORDER BY st.resource_id)
      FROM starts st JOIN free f ON f.resource_id = st.resource_id, sv
     WHERE st.t >= sv.t_from AND st.t < sv.t_to
       AND f.times @> booking_blocked_range(st.t, st.t + sv.duration_minutes * interval '1 minute',
                                            sv.buffer_before_minutes, sv.buffer_after_minutes)
     GROUP BY st.t
     ORDER BY st.t
$$;
