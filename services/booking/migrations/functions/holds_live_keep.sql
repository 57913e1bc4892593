-- A hold changed: the held holds' table says the same in the statement that changed it (holds_live;
-- migration 0330). A held hold has its row with its expiry; any other hold has none.
CREATE OR REPLACE FUNCTION holds_live_keep() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM holds_live WHERE hold_id = OLD.id;
    ELSIF NEW.status <> 'held' THEN
        DELETE FROM holds_live WHERE hold_id = NEW.id;
    ELSE
        INSERT INTO holds_live (hold_id, expires_at) VALUES (NEW.id, NEW.expires_at)
        ON CONFLICT (hold_id) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    END IF;
    RETURN NULL;
END $$;
