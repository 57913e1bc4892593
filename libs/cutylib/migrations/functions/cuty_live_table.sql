-- A table of a history's live rows (docs/conventions.md: the saga's `sagas_live`, payments'
-- `payments_live`, booking's `holds_live`), kept by trigger beside a table that keeps everything.
-- Its rows churn, so its indexes collect dead entries at the head a claim starts from; only a
-- VACUUM removes them. As small as the work in flight, it is vacuumed and analysed after a fixed
-- number of changes (not a fifth of it, autovacuum's default), with no pause: each autovacuum
-- round that finds 1,000 changes cleans it. Analysed now too: never analysed, a table is taken for
-- ten pages of rows, and a claim's join with its history may then look cheaper as a hash over the
-- whole history. Called by the migration that creates the table, once its rows are in.
CREATE OR REPLACE FUNCTION cuty_live_table(t regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, '
                   'autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 1000, '
                   'autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0, '
                   'autovacuum_analyze_threshold = 1000)', t);
    EXECUTE format('ANALYZE %s', t);
END
$$;
