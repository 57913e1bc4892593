-- The timeline: each event carries the merchant of its payment or checkout. It is written by many
-- statements (finalize, every saga transition), so one trigger fills it from the row it is about
-- instead of every statement repeating the lookup; a checkout's events from before its hold have
-- none (NULL: seen by the customer's checkout view and the platform only).
CREATE OR REPLACE FUNCTION payment_events_merchant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.merchant_id IS NULL THEN
        NEW.merchant_id := COALESCE(
            (SELECT p.merchant_id FROM payments p WHERE p.id = NEW.payment_id),
            (SELECT c.merchant_id FROM checkouts c WHERE c.id = NEW.checkout_id));
    END IF;
    RETURN NEW;
END $$;
