-- The trigger of history tables: the operation is refused, with the reason given as the trigger's
-- argument.
CREATE OR REPLACE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%: % is not allowed (%)', TG_TABLE_NAME, TG_OP, TG_ARGV[0] USING ERRCODE = 'insufficient_privilege';
END $$;
