-- A payment changed: the live payments' table says the same in the statement that changed it
-- (payments_live; migration 0331). A payment not final (created, requires_action, processing) has
-- its row with its status, when the reconciler looks at it next, and its times; a final one has none.
CREATE OR REPLACE FUNCTION payments_live_keep() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM payments_live WHERE payment_id = OLD.id;
    ELSIF NEW.status NOT IN ('created', 'requires_action', 'processing') THEN
        DELETE FROM payments_live WHERE payment_id = NEW.id;
    ELSE
        INSERT INTO payments_live (payment_id, status, reconcile_at, created_at, updated_at)
        VALUES (NEW.id, NEW.status, NEW.reconcile_at, NEW.created_at, NEW.updated_at)
        ON CONFLICT (payment_id) DO UPDATE
            SET status = EXCLUDED.status, reconcile_at = EXCLUDED.reconcile_at, updated_at = EXCLUDED.updated_at;
    END IF;
    RETURN NULL;
END $$;
