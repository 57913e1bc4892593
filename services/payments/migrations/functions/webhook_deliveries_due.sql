-- A delivery written, or due sooner than before (redelivered, retried): its merchant's mark is due
-- by then (webhook_merchant_due; migration 0310), in the statement that made it due.
CREATE OR REPLACE FUNCTION webhook_deliveries_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhook_merchant_due(NEW.merchant_id, NEW.next_attempt_at);
    RETURN NULL;
END $$;
