-- Claims on delivered codes and supplier batches held back (docs/codepool.md, "Claims, replacement
-- and batch quarantine"; docs/payments.md, "Code claims"). The code pool writes their events into
-- its outbox; the relay (payments/outbound/relay.py) stores them as merchant events and, for an
-- event about an order, appends it to that checkout's payment timeline (source 'claim') in the same
-- statement: once, with the merchant event.
ALTER TABLE payment_events DROP CONSTRAINT payment_events_source_check;
-- payment_events may be partitioned already (when the partitioning migration ran first on this
-- database): a partition may then hold its own copy of the old CHECK, which the parent's DROP
-- leaves behind; those go too, and the parent's new CHECK reaches every partition.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.conrelid::regclass AS t FROM pg_constraint c JOIN pg_inherits i ON i.inhrelid = c.conrelid
             WHERE i.inhparent = 'payment_events'::regclass AND c.conname = 'payment_events_source_check' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT payment_events_source_check', r.t);
    END LOOP;
END $$;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_source_check
    CHECK (source IN ('sync', 'webhook', 'reconcile', 'saga', 'claim'));

ALTER TABLE merchant_events DROP CONSTRAINT merchant_events_type_check;
ALTER TABLE merchant_events ADD CONSTRAINT merchant_events_type_check CHECK (type IN (
    'checkout.completed', 'booking.confirmed', 'codes.delivered', 'checkout.refunded', 'booking.cancelled',
    'booking.rescheduled', 'stock.low', 'code.claimed', 'code.replaced', 'code.claim_rejected',
    'code.claim_refunded', 'batch.quarantined'));
