-- Retention (docs/architecture.md, "Retention"): detaches every partition of `parent` whose rows are
-- all older than `keep_after` (its upper bound <= keep_after), whole: no row is deleted, so the
-- table's append-only trigger never has to let a DELETE through. The lock the DETACH needs waits at
-- most `lock_timeout_ms` (a long read of the table makes this round skip, the next one retries).
-- Returns the detached tables waiting for their archive and DROP (cuty_partition_drop): the ones
-- detached now and any an earlier round detached and did not drop (a crash between the two).
CREATE OR REPLACE FUNCTION cuty_partitions_detach(parent regclass, keep_after timestamptz, lock_timeout_ms integer)
RETURNS SETOF text LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    p record;
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout_ms::text, true);
    FOR p IN SELECT b.partition FROM cuty_partition_bounds(parent) b
             WHERE b.upper IS NOT NULL AND b.upper <= keep_after ORDER BY b.upper LOOP
        EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', parent, p.partition);
    END LOOP;
    RETURN QUERY
        SELECT c.relname::text FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND NOT c.relispartition
          AND (c.relname LIKE parent::text || '\_p%' OR c.relname = parent::text || '_legacy')
        ORDER BY c.relname;
END
$$;
