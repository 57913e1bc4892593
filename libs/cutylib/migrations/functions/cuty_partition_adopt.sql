-- Turning a table into a partitioned one keeps its rows where they are: the migration renames the
-- old table to `legacy`, creates `parent` PARTITIONED BY RANGE on its time column, and calls this,
-- which attaches `legacy` as the partition of everything before the end of the current grid period
-- (the rows of now included) and creates the partitions after it (cuty_partitions_ahead). The
-- legacy partition leaves whole, like any other, once that end is past the retention.
CREATE OR REPLACE FUNCTION cuty_partition_adopt(parent regclass, legacy regclass, width_days integer, ahead integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (MINVALUE) TO (%L)', parent, legacy,
                   cuty_partition_grid(now(), width_days) + make_interval(days => width_days));
    PERFORM cuty_partitions_ahead(parent, width_days, ahead);
END
$$;
