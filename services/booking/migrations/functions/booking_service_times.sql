-- Free start times of a service in [p_from, p_to) (docs/booking.md, "Availability"), each with the
-- able resources free for it (p_resource_id: only that one; NULL: any able resource). Computed,
-- not stored: per resource, its working time (booking_working_ranges) minus the time its live holds
-- and bookings block (buffers included), as a multirange of maximal free ranges. In a free range
-- [lo, hi) a start s fits when [s - buffer before, s + duration + buffer after) lies inside it, so
-- the starts are generated straight from each free range, none to be filtered out afterwards.
-- Starts are on the salon's grid (local wall times a multiple of time_step_minutes after
-- midnight: the first one found from the range's local time, then real-time steps, which a
-- whole-hour DST change keeps on the grid), and respect the salon's minimum notice and booking
-- horizon (database clock). This is the same test booking_take_service_hold makes of one time.
-- PL/pgSQL, so the statement's plan is prepared once per connection (a SQL function called from a
-- query is inlined and planned again on every call), and without JIT: the planner's estimate of
-- the generated starts (1,000 per free range) puts the statement far above jit_above_cost, and
-- compiling it costs tens of milliseconds on a quiet machine (seconds on a loaded one) for a
-- statement that runs in a few.
CREATE OR REPLACE FUNCTION booking_service_times(p_merchant_id text, p_service_id uuid, p_resource_id uuid,
                                                 p_from timestamptz, p_to timestamptz)
RETURNS TABLE (start_time timestamptz, resource_ids uuid[])
LANGUAGE plpgsql STABLE SET jit = off AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        WITH sv AS (
            SELECT s.salon_id, sa.time_zone, sa.time_step_minutes AS step,
                   (s.duration_minutes + s.buffer_after_minutes) * interval '1 minute' AS after_start,
                   s.buffer_before_minutes * interval '1 minute' AS before_start,
                   greatest(p_from, clock_timestamp() + sa.min_notice_minutes * interval '1 minute') AS t_from,
                   least(p_to, clock_timestamp() + sa.booking_horizon_days * interval '1 day') AS t_to,
                   clock_timestamp() AS now
              FROM services s JOIN salons sa ON sa.merchant_id = s.merchant_id AND sa.id = s.salon_id
             WHERE s.merchant_id = p_merchant_id AND s.id = p_service_id
        ), able AS (
            SELECT array_agg(sr.resource_id) AS ids FROM service_resources sr
             WHERE sr.merchant_id = p_merchant_id AND sr.service_id = p_service_id
               AND (p_resource_id IS NULL OR sr.resource_id = p_resource_id)
        ), free AS MATERIALIZED (
            -- per resource: its working time minus what its live holds and bookings block
            SELECT w.resource_id,
                   range_agg(w.during) - coalesce((
                       SELECT range_agg(h.during) FROM holds h
                        WHERE h.merchant_id = p_merchant_id AND h.resource_id = w.resource_id
                          AND h.status IN ('held', 'confirmed')
                          AND h.during && tstzrange(min(sv.t_from) - interval '1 day', min(sv.t_to) + interval '1 day')
                          -- the same, leakproof, for the index under RLS (0170_holds_live_times.sql)
                          AND h.start_time < min(sv.t_to) + interval '1 day 240 minutes'
                          AND h.end_time > min(sv.t_from) - interval '1 day 240 minutes'
                          AND (h.status = 'confirmed' OR h.expires_at > min(sv.now))), '{}'::tstzmultirange) AS times
              FROM sv, able, booking_working_ranges(p_merchant_id, sv.salon_id, able.ids,
                                                    (sv.t_from AT TIME ZONE sv.time_zone)::date - 1,
                                                    (sv.t_to AT TIME ZONE sv.time_zone)::date) w
             WHERE sv.t_from < sv.t_to AND able.ids IS NOT NULL
             GROUP BY w.resource_id
        ), spans AS MATERIALIZED (
            -- the starts a free range allows: from lo (its start plus the buffer before, not before
            -- t_from) up to hi (its end less the service and the buffer after, before t_to)
            SELECT f.resource_id, greatest(lower(r) + sv.before_start, sv.t_from) AS lo,
                   least(upper(r) - sv.after_start, sv.t_to - interval '1 microsecond') AS hi
              FROM free f, sv, unnest(f.times) r
        ), firsts AS MATERIALIZED (
            SELECT sp.resource_id, sp.hi,
                   date_trunc('minute', sp.lo + interval '59.999999 seconds')
                   + mod(sv.step - mod(floor(extract(epoch FROM
                       (date_trunc('minute', sp.lo + interval '59.999999 seconds') AT TIME ZONE sv.time_zone)::time)
                       / 60)::integer, sv.step), sv.step) * interval '1 minute' AS first
              FROM spans sp, sv
             WHERE sp.lo <= sp.hi
        )
        SELECT to_timestamp(e), array_agg(f.resource_id ORDER BY f.resource_id)
          FROM firsts f, sv,
               generate_series(extract(epoch FROM f.first)::bigint, extract(epoch FROM f.hi)::bigint, sv.step * 60) e
         GROUP BY e
         ORDER BY e;
END
$$;
