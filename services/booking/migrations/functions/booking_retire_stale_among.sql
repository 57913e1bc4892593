-- booking_retire_stale for several resources of a merchant at once (a service hold's able
-- resources, before one of them is taken): their expired holds still marked 'held' that overlap
-- [p_start, p_end) become 'expired'. One resource after the other in resource id order, each
-- locking its rows in id order: every taker locks in that one order (a single resource's taker
-- too), so two takers never deadlock; the constraint decides every race, not this.
CREATE OR REPLACE FUNCTION booking_retire_stale_among(p_merchant_id text, p_resources uuid[], p_start timestamptz,
                                                      p_end timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n          integer := 0;
    v_resource uuid;
BEGIN
    -- only the resources that have such a hold (one statement, usually none): a call per resource
    -- would cost a service hold of 20 able resources 20 calls and their plans
    FOR v_resource IN SELECT DISTINCT r FROM unnest(p_resources) AS r
                       WHERE r IS NOT NULL
                         AND EXISTS (SELECT 1 FROM holds h
                                      WHERE h.merchant_id = p_merchant_id AND h.resource_id = r
                                        -- as in booking_retire_stale: by the live holds' index
                                        AND h.status IN ('held', 'confirmed') AND h.status <> 'confirmed'
                                        AND h.expires_at <= clock_timestamp()
                                        AND h.during && tstzrange(p_start, p_end)
                                        -- leakproof, for the index under RLS (0170_holds_live_times.sql)
                                        AND h.start_time < p_end + interval '240 minutes'
                                        AND h.end_time > p_start - interval '240 minutes')
                       ORDER BY r LOOP
        n := n + booking_retire_stale(p_merchant_id, v_resource, p_start, p_end);
    END LOOP;
    RETURN n;
END
$$;
