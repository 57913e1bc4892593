-- The batch size a retention move function (`<table>_move(batch, finished_before)`, cutylib.retention)
-- is called with, checked: 1..10000 rows a transaction, else invalid_parameter_value.
CREATE OR REPLACE FUNCTION cuty_move_batch(batch integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF batch IS NULL OR batch < 1 OR batch > 10000 THEN
        RAISE EXCEPTION 'batch must be 1..10000, got %', batch USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN batch;
END
$$;
