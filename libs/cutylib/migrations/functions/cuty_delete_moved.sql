-- The delete guard of a live table whose finished rows move into a history table (cutylib.retention,
-- docs/architecture.md "Retention"): a row leaves the live table only once the history holds it.
-- Trigger arguments: the history table, then the key columns the two tables share. The move
-- function copies its rows into the history and deletes them in one transaction, so its DELETE
-- passes; any other DELETE (a person's, a bug's) is refused, and nothing is ever lost by one.
CREATE OR REPLACE FUNCTION cuty_delete_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    held boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT FROM %s h WHERE %s)', TG_ARGV[0],
                   (SELECT string_agg(format('h.%1$I = ($1).%1$I', k), ' AND ')
                      FROM unnest(TG_ARGV[1:]) k))
       INTO held USING OLD;
    IF NOT held THEN
        RAISE EXCEPTION '%: DELETE is not allowed (a row leaves only by moving into %)', TG_TABLE_NAME, TG_ARGV[0]
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN OLD;
END $$;
