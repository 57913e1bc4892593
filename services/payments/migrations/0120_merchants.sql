-- Issue 14, merchants as tenants (docs/tenancy.md). A checkout and its payment belong to the
-- merchant of what was bought; the PSP's events and the customers' Idempotency-Keys stay global.

-- Checkouts learn their merchant from the hold or reservation (booking's / the code pool's answer),
-- recorded by the transition to HELD in the same statement; before that (PENDING, or REJECTED
-- without anything held) it is NULL and only the customer and the platform see the checkout.
-- Once set it never changes (cuty_merchant_immutable).
ALTER TABLE checkouts ADD COLUMN merchant_id text CHECK (merchant_id <> '' AND length(merchant_id) <= 200);
UPDATE checkouts SET merchant_id = 'default' WHERE state NOT IN ('PENDING', 'REJECTED');
ALTER TABLE checkouts ADD CONSTRAINT checkouts_held_has_merchant CHECK (
    state IN ('PENDING', 'REJECTED') OR merchant_id IS NOT NULL);
-- Keys ready for distribution by merchant: the payment attempt id is unique within its merchant
-- (a checkout gets one only once it holds something, so its merchant is known by then).
ALTER TABLE checkouts DROP CONSTRAINT checkouts_payment_key_key;
ALTER TABLE checkouts ADD CONSTRAINT checkouts_payment_key UNIQUE (merchant_id, payment_key);
ALTER TABLE checkouts ADD CONSTRAINT checkouts_merchant_id UNIQUE (merchant_id, id);
-- Staff read their merchant's checkouts newest first.
CREATE INDEX checkouts_by_merchant ON checkouts (merchant_id, created_at) WHERE merchant_id IS NOT NULL;

-- Payments: the checkout's merchant, given when the payment is created (CreatePaymentRequest).
ALTER TABLE payments ADD COLUMN merchant_id text CHECK (merchant_id <> '' AND length(merchant_id) <= 200);
UPDATE payments p SET merchant_id = COALESCE((SELECT c.merchant_id FROM checkouts c WHERE c.id = p.checkout_id),
                                             'default');
ALTER TABLE payments ALTER COLUMN merchant_id SET NOT NULL;
ALTER TABLE payments DROP CONSTRAINT payments_idempotency_key_key;
ALTER TABLE payments ADD CONSTRAINT payments_idempotency_key UNIQUE (merchant_id, idempotency_key);
ALTER TABLE payments ADD CONSTRAINT payments_merchant_id UNIQUE (merchant_id, id);
DROP INDEX payments_checkout;
CREATE INDEX payments_checkout ON payments (merchant_id, checkout_id) WHERE checkout_id IS NOT NULL;
-- psp_intent_id stays UNIQUE on its own: it is the PSP's id space, and a webhook (global, signed
-- by the PSP) names the intent before anyone knows whose payment it is.

-- The timeline: each event carries the merchant of its payment or checkout. It is written by many
-- statements (finalize, every saga transition), so one trigger fills it from the row it is about
-- instead of every statement repeating the lookup; a checkout's events from before its hold have
-- none (NULL: seen by the customer's checkout view and the platform only).
ALTER TABLE payment_events ADD COLUMN merchant_id text;
ALTER TABLE payment_events DISABLE TRIGGER payment_events_append_only;
UPDATE payment_events e SET merchant_id = COALESCE(
    (SELECT p.merchant_id FROM payments p WHERE p.id = e.payment_id),
    (SELECT c.merchant_id FROM checkouts c WHERE c.id = e.checkout_id));
ALTER TABLE payment_events ENABLE TRIGGER payment_events_append_only;

CREATE FUNCTION payment_events_merchant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.merchant_id IS NULL THEN
        NEW.merchant_id := COALESCE(
            (SELECT p.merchant_id FROM payments p WHERE p.id = NEW.payment_id),
            (SELECT c.merchant_id FROM checkouts c WHERE c.id = NEW.checkout_id));
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER payment_events_merchant BEFORE INSERT ON payment_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_merchant();

DROP INDEX payment_events_payment;
CREATE INDEX payment_events_payment ON payment_events (merchant_id, payment_id, seq) WHERE payment_id IS NOT NULL;

SELECT cuty_tenant_table('checkouts');
SELECT cuty_tenant_table('payments');
SELECT cuty_tenant_table('payment_events');

-- Every read by the platform's operator (support, across merchants): who, which RPC, what, whose.
-- Global (the platform's own record, kept whatever merchant was read), append-only.
CREATE TABLE operator_reads (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject     text NOT NULL CHECK (subject <> ''),
    rpc         text NOT NULL,
    object_id   text NOT NULL,
    -- whose object was read (not a tenant key: this table is the platform's, not a merchant's)
    of_merchant text,
    trace_id    text NOT NULL DEFAULT '',
    read_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX operator_reads_by_merchant ON operator_reads (of_merchant, read_at);
CREATE TRIGGER operator_reads_append_only BEFORE UPDATE OR DELETE ON operator_reads
    FOR EACH ROW EXECUTE FUNCTION payment_events_append_only();
