-- Drops a partition that cuty_partitions_detach detached from `parent` (named as its partitions are,
-- and no longer attached), after the retention job archived it. Anything else is refused.
CREATE OR REPLACE FUNCTION cuty_partition_drop(parent regclass, detached text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class c
                   WHERE c.relname = detached AND c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
                     AND NOT c.relispartition
                     AND (c.relname LIKE parent::text || '\_p%' OR c.relname = parent::text || '_legacy')) THEN
        RAISE EXCEPTION '% is not a detached partition of %', detached, parent USING ERRCODE = 'invalid_parameter_value';
    END IF;
    EXECUTE format('DROP TABLE %I', detached);
END
$$;
