-- The working time of a salon's resources (all of them, or those in p_resources) for the intervals
-- that open on the local days p_from .. p_to, as instants (docs/booking.md, "Working hours").
-- Per resource and day, the first of these that exists is used: the resource's own overrides of
-- that day, the salon's overrides of that day, the resource's weekly hours of that weekday. An
-- override row without times is a day off. Wall times become instants in the salon's zone, so a
-- DST day's 09:00-18:00 is 9 real hours whatever the offset, and 01:00-05:00 across the change is
-- 3 (spring) or 5 (autumn); `closes <= opens` closes on the next day.
CREATE OR REPLACE FUNCTION booking_working_ranges(p_merchant_id text, p_salon_id uuid, p_resources uuid[],
                                                  p_from date, p_to date)
RETURNS TABLE (resource_id uuid, during tstzrange)
LANGUAGE sql STABLE AS $$
    WITH overrides AS MATERIALIZED (
        SELECT o.resource_id, o.day, o.opens, o.closes FROM hours_overrides o
         WHERE o.merchant_id = p_merchant_id AND o.salon_id = p_salon_id AND o.day BETWEEN p_from AND p_to
    ), hours AS (
        -- the resource's own override of the day
        SELECT o.resource_id AS rid, o.day, o.opens, o.closes
          FROM overrides o
         WHERE o.resource_id IS NOT NULL AND (p_resources IS NULL OR o.resource_id = ANY (p_resources))
        UNION ALL
        -- else the salon's override of the day
        SELECT r.id, o.day, o.opens, o.closes
          FROM overrides o JOIN resources r ON r.merchant_id = p_merchant_id AND r.salon_id = p_salon_id
         WHERE o.resource_id IS NULL AND (p_resources IS NULL OR r.id = ANY (p_resources))
           AND NOT EXISTS (SELECT 1 FROM overrides mine WHERE mine.resource_id = r.id AND mine.day = o.day)
        UNION ALL
        -- else the weekly hours
        SELECT w.resource_id, d.day, w.opens, w.closes
          FROM generate_series(p_from, p_to, interval '1 day') g(d)
         CROSS JOIN LATERAL (SELECT g.d::date AS day) d
          JOIN working_hours w
            ON w.merchant_id = p_merchant_id AND w.salon_id = p_salon_id
           AND w.weekday = extract(isodow FROM d.day)::smallint
         WHERE (p_resources IS NULL OR w.resource_id = ANY (p_resources))
           AND NOT EXISTS (SELECT 1 FROM overrides o
                            WHERE o.day = d.day AND (o.resource_id = w.resource_id OR o.resource_id IS NULL))
    )
    SELECT h.rid,
           tstzrange((h.day + h.opens) AT TIME ZONE sa.time_zone,
                     (h.day + CASE WHEN h.closes <= h.opens THEN 1 ELSE 0 END + h.closes) AT TIME ZONE sa.time_zone)
      FROM hours h JOIN salons sa ON sa.merchant_id = p_merchant_id AND sa.id = p_salon_id
     WHERE h.opens IS NOT NULL
$$;
