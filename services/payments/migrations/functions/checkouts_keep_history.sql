-- Only a checkout that never held anything may disappear (a CreateCheckout refused for bad input:
-- "nothing changes"); everything else is history.
CREATE OR REPLACE FUNCTION checkouts_keep_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state <> 'PENDING' THEN
        RAISE EXCEPTION 'checkout % in state % may not be deleted', OLD.id, OLD.state
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN OLD;
END $$;
