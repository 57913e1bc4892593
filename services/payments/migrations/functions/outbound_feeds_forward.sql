-- The relay's cursor into a feed only moves forward.
CREATE OR REPLACE FUNCTION outbound_feeds_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.after_seq < OLD.after_seq THEN
        RAISE EXCEPTION 'feed %: cursor % -> % goes back', OLD.feed, OLD.after_seq, NEW.after_seq
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
