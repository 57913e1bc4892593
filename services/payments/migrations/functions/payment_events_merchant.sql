-- The merchant of a timeline event, looked up from its payment or checkout. No trigger calls it
-- since migration 0005 (every statement names the merchant itself); it stays defined only because
-- the baseline (0001) declares its trigger with it, so a new database must have it to get to 0005.
CREATE OR REPLACE FUNCTION payment_events_merchant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.merchant_id IS NULL THEN
        NEW.merchant_id := COALESCE(
            (SELECT p.merchant_id FROM payments p WHERE p.id = NEW.payment_id),
            (SELECT c.merchant_id FROM checkouts c WHERE c.id = NEW.checkout_id));
    END IF;
    RETURN NEW;
END $$;
