-- booking_retire_stale for several resources of a merchant at once (a service hold's able
-- resources, before one of them is taken): their expired holds still marked 'held' that overlap
-- [p_start, p_end) become 'expired'. Locked in id order first, as booking_retire_stale, for the
-- same reason (two takers never deadlock); the constraint decides every race, not this.
CREATE OR REPLACE FUNCTION booking_retire_stale_among(p_merchant_id text, p_resources uuid[], p_start timestamptz,
                                                      p_end timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n    integer := 0;
    v_id uuid;
BEGIN
    FOR v_id IN SELECT h.id FROM holds h
                 WHERE h.merchant_id = p_merchant_id
                   AND h.resource_id = ANY (p_resources)
                   AND h.status = 'held'
                   AND h.during && tstzrange(p_start, p_end)
                   AND h.expires_at <= clock_timestamp()
                 ORDER BY h.id
                   FOR UPDATE
    LOOP
        UPDATE holds SET status = 'expired', updated_at = clock_timestamp() WHERE id = v_id AND status = 'held';
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;
