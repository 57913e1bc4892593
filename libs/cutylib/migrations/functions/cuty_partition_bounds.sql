-- The partitions of a table partitioned BY RANGE on one timestamptz column, with their bounds (NULL:
-- MINVALUE / MAXVALUE), read from the catalog (cuty_partitions_ahead, cuty_partitions_detach).
CREATE OR REPLACE FUNCTION cuty_partition_bounds(parent regclass)
RETURNS TABLE (partition text, lower timestamptz, upper timestamptz) LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass::text,
           nullif(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)'), '')::timestamptz,
           nullif(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)'), '')::timestamptz
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent
$$;
