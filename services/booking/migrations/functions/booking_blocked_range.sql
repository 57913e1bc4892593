-- The time a hold blocks its resource: [start - buffer before, end + buffer after). Immutable (a
-- generated column's expression must be): minutes are a fixed length in every zone, unlike the
-- days and months that make timestamptz + interval only stable.
CREATE OR REPLACE FUNCTION booking_blocked_range(p_start timestamptz, p_end timestamptz, p_before_minutes integer,
                                                 p_after_minutes integer) RETURNS tstzrange
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT tstzrange(p_start - p_before_minutes * interval '1 minute', p_end + p_after_minutes * interval '1 minute')
$$;
