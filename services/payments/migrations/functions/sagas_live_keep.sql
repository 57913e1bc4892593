-- A checkout changed: the live sagas' table says the same in the statement that changed it (sagas_live;
-- migration 0330). A checkout not finished, or with a next run, has its row with its state, the time
-- of that state and its next run; a finished one with nothing left to run (and a refused checkout
-- deleted) has none.
CREATE OR REPLACE FUNCTION sagas_live_keep() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM sagas_live WHERE checkout_id = OLD.id;
    ELSIF NEW.next_run_at IS NULL
          AND NEW.state IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED', 'CANCELLED_AFTER_PURCHASE') THEN
        DELETE FROM sagas_live WHERE checkout_id = NEW.id;
    ELSE
        INSERT INTO sagas_live (checkout_id, state, updated_at, next_run_at)
        VALUES (NEW.id, NEW.state, NEW.updated_at, NEW.next_run_at)
        ON CONFLICT (checkout_id) DO UPDATE
            SET state = EXCLUDED.state, updated_at = EXCLUDED.updated_at, next_run_at = EXCLUDED.next_run_at;
    END IF;
    RETURN NULL;
END $$;
