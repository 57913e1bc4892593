-- The delete guard of a live table whose finished rows move into a history table (cutylib.retention,
-- docs/architecture.md "Retention"): a row leaves the live table only once the history holds it.
-- A statement trigger, AFTER DELETE ... REFERENCING OLD TABLE AS gone FOR EACH STATEMENT, with the
-- history table, then the key columns the two tables share, as arguments: one anti-join per
-- statement (a row trigger's lookup per row cost the mover most of its batch). The move function
-- copies its rows into the history and deletes them in one transaction, so its DELETE passes; any
-- other DELETE (a person's, a bug's) is refused whole, and nothing is ever lost by one.
CREATE OR REPLACE FUNCTION cuty_delete_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    stray boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT FROM gone o WHERE NOT EXISTS (SELECT FROM %s h WHERE %s))', TG_ARGV[0],
                   (SELECT string_agg(format('h.%1$I = o.%1$I', k), ' AND ') FROM unnest(TG_ARGV[1:]) k))
       INTO stray;
    IF stray THEN
        RAISE EXCEPTION '%: DELETE is not allowed (a row leaves only by moving into %)', TG_TABLE_NAME, TG_ARGV[0]
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END $$;
