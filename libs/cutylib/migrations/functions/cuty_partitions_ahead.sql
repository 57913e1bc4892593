-- Time partitions of an append-only table (docs/architecture.md, "Retention"): the partitions of
-- `parent` (partitioned BY RANGE on a timestamptz column) from the one holding now() to `ahead`
-- more, each `width_days` wide on a grid from 2000-01-01 UTC, named <parent>_p<YYYYMMDD of the
-- start>. Partitions that exist are left alone; a range overlapping an existing partition (the
-- pre-partitioning rows' `_legacy` partition) starts where that one ends. Run by the retention
-- job of the service that owns the table (cutylib.retention) as the table's owner (SECURITY
-- DEFINER: the service's role owns nothing). Returns the partitions created.
CREATE OR REPLACE FUNCTION cuty_partitions_ahead(parent regclass, width_days integer, ahead integer)
RETURNS SETOF text LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    width constant interval := make_interval(days => width_days);
    first_start timestamptz;
    lo timestamptz;
    hi timestamptz;
    covered timestamptz;
    name text;
BEGIN
    IF width_days < 1 OR ahead < 0 OR ahead > 100 THEN
        RAISE EXCEPTION 'width_days must be >= 1 and ahead 0..100' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    first_start := cuty_partition_grid(now(), width_days);
    FOR i IN 0..ahead LOOP
        lo := first_start + width * i;
        hi := lo + width;
        name := format('%s_p%s', parent::text, to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD'));
        CONTINUE WHEN to_regclass(name) IS NOT NULL;
        -- The highest upper bound below `hi` of the partitions there are: the new one starts there.
        SELECT max(b.upper) INTO covered FROM cuty_partition_bounds(parent) b WHERE b.lower IS NULL OR b.lower < hi;
        IF covered IS NOT NULL AND covered > lo THEN
            CONTINUE WHEN covered >= hi;
            lo := covered;
        END IF;
        EXECUTE format('CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)', name, parent, lo, hi);
        -- A merchant's table keeps its policy on each partition (the services' role may name one).
        IF (SELECT relrowsecurity FROM pg_class WHERE oid = parent) THEN
            PERFORM cuty_tenant_rls(name::regclass);
        END IF;
        RETURN NEXT name;
    END LOOP;
END
$$;
