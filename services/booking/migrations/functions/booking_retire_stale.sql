-- Expired holds still marked 'held' that overlap [p_start, p_end) on a merchant's resource become
-- 'expired', so that the exclusion constraint holds_no_overlap stops counting them; the lookup
-- walks the live holds' index (holds_live_times) by merchant, resource and time. The rows are
-- locked in id order first: two takers of overlapping slots could otherwise lock the same stale
-- rows in different orders and deadlock
-- (this lock does not decide any race; the constraint does). Then each is updated by its primary
-- key: as one `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE)` a generic plan built while the
-- table's statistics lag behind (a table that filled fast) may walk every held hold instead.
-- Returns how many holds it retired.
CREATE OR REPLACE FUNCTION booking_retire_stale(p_merchant_id text, p_resource_id uuid, p_start timestamptz,
                                     p_end timestamptz, p_except uuid DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n    integer := 0;
    v_id uuid;
BEGIN
    FOR v_id IN SELECT h.id FROM holds h
                 WHERE h.merchant_id = p_merchant_id
                   AND h.resource_id = p_resource_id
                   -- 'held' said so that no index of held holds alone can serve it, the live
                   -- holds' ones must (booking/repository.py, HELD): as `status = 'held'`,
                   -- statistics taken before the day's holds had the planner walk
                   -- holds_customer_held, every held hold of every merchant, on each call.
                   AND h.status IN ('held', 'confirmed') AND h.status <> 'confirmed'
                   AND h.during && tstzrange(p_start, p_end)
                   -- the same, leakproof, for the index under RLS (0170_holds_live_times.sql)
                   AND h.start_time < p_end + interval '240 minutes' AND h.end_time > p_start - interval '240 minutes'
                   AND h.expires_at <= clock_timestamp()
                   AND h.id IS DISTINCT FROM p_except
                 ORDER BY h.id
                   FOR UPDATE
    LOOP
        UPDATE holds SET status = 'expired', updated_at = clock_timestamp()
         WHERE id = v_id AND status IN ('held', 'confirmed') AND status <> 'confirmed';
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;
