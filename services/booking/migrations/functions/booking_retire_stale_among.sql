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
    FOR v_resource IN SELECT DISTINCT r FROM unnest(p_resources) AS r WHERE r IS NOT NULL ORDER BY r LOOP
        n := n + booking_retire_stale(p_merchant_id, v_resource, p_start, p_end);
    END LOOP;
    RETURN n;
END
$$;
