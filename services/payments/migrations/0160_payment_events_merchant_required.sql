-- Every statement that appends to the timeline names the event's merchant itself, taken from the row
-- the event is about (tests/unit/payments/test_payments_events_name_their_merchant.py), so the
-- lookup trigger that filled a missing one is gone. A missing merchant now fails the insert: only
-- the saga's event of a checkout that holds nothing yet (no merchant until its hold, no payment)
-- has none (docs/tenancy.md).
DROP TRIGGER payment_events_merchant ON payment_events;
DROP FUNCTION payment_events_merchant();
ALTER TABLE payment_events ADD CONSTRAINT payment_events_merchant_required
    CHECK (merchant_id IS NOT NULL OR (source = 'saga' AND payment_id IS NULL));
