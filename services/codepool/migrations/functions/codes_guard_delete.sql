-- Only an available code may be deleted: a reserved or delivered one is part of an order's history.
CREATE OR REPLACE FUNCTION codes_guard_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status <> 'available' THEN
        RAISE EXCEPTION 'code %: a % code cannot be deleted', OLD.id, OLD.status USING ERRCODE = 'check_violation';
    END IF;
    RETURN OLD;
END $$;
