-- Every statement that appends to the timeline now names the event's merchant itself, from the row
-- it is about (the payment's, or the checkout's once held; tests/unit/payments/
-- test_payments_events_name_their_merchant.py), so the trigger that looked it up afterwards goes.
-- An event about a payment always has its merchant: the CHECK refuses a statement that forgets it.
DROP TRIGGER payment_events_merchant ON payment_events;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_payment_has_merchant
    CHECK (payment_id IS NULL OR merchant_id IS NOT NULL);
