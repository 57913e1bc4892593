-- Status transitions of the tables other than codes, given as 'from>to' trigger arguments.
CREATE OR REPLACE FUNCTION enforce_status_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT ((OLD.status || '>' || NEW.status) = ANY (TG_ARGV)) THEN
        RAISE EXCEPTION '%: status % -> % is not allowed', TG_TABLE_NAME, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
