-- The timeline: each event carries the merchant of its payment or checkout. Every statement that
-- appends one names it itself (tests/unit/payments/test_payments_events_name_their_merchant.py);
-- this trigger only fills one left NULL, which none of them leaves where a merchant is known. A
-- checkout's events from before its hold have none (NULL: seen by the customer's checkout view and
-- the platform only).
CREATE OR REPLACE FUNCTION payment_events_merchant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.merchant_id IS NULL THEN
        NEW.merchant_id := COALESCE(
            (SELECT p.merchant_id FROM payments p WHERE p.id = NEW.payment_id),
            (SELECT c.merchant_id FROM checkouts c WHERE c.id = NEW.checkout_id));
    END IF;
    RETURN NEW;
END $$;
