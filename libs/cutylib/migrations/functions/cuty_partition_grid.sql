-- The start of the time partition holding `at`: partitions are `width_days` wide on a fixed grid
-- from 2000-01-01 UTC (docs/architecture.md, "Retention").
CREATE OR REPLACE FUNCTION cuty_partition_grid(at timestamptz, width_days integer) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT timestamptz '2000-01-01 00:00:00+00'
           + make_interval(days => width_days)
             * floor(extract(epoch FROM at - timestamptz '2000-01-01 00:00:00+00') / (width_days * 86400.0))
$$;
