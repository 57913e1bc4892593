-- The no-show fee (docs/checkout.md, "No-show fee"): the customer accepts the salon's fee at
-- purchase (PayCheckout), the purchase's card is saved at the PSP for off-session use, and when
-- staff mark a no-show the fee is charged off-session once, as its own payment of the checkout.

-- The acceptance, recorded with the checkout by the statement that starts the purchase: what was
-- accepted (the amount, in the checkout's currency; PayCheckout refuses more than the booking's
-- price, and a reschedule to a cheaper slot keeps what was accepted) and when.
-- The charge: 'due' (set by the no-show's own statement), then 'charged' or 'declined' with its
-- payment; a lease keeps two workers off one charge, and next_at is when a due one is tried again.
ALTER TABLE checkouts
    ADD COLUMN no_show_fee_minor bigint CONSTRAINT checkouts_no_show_fee_positive CHECK (no_show_fee_minor > 0),
    ADD COLUMN no_show_fee_accepted_at timestamptz,
    ADD COLUMN no_show_fee_status text
        CONSTRAINT checkouts_no_show_fee_status_check CHECK (no_show_fee_status IN ('due', 'charged', 'declined')),
    ADD COLUMN no_show_fee_payment_id uuid,
    ADD COLUMN no_show_fee_lease_owner text,
    ADD COLUMN no_show_fee_lease_until timestamptz,
    ADD COLUMN no_show_fee_next_at timestamptz,
    ADD COLUMN no_show_fee_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN no_show_fee_failure text,
    ADD CONSTRAINT checkouts_no_show_fee_accepted CHECK ((no_show_fee_minor IS NULL) = (no_show_fee_accepted_at IS NULL)),
    -- Never charged without the customer's acceptance, nor before a no-show.
    ADD CONSTRAINT checkouts_no_show_fee_only_accepted CHECK (
        no_show_fee_status IS NULL OR (no_show_fee_minor IS NOT NULL AND no_show_at IS NOT NULL)),
    ADD CONSTRAINT checkouts_no_show_fee_charged_has_payment CHECK (
        no_show_fee_status IS DISTINCT FROM 'charged' OR no_show_fee_payment_id IS NOT NULL),
    ADD CONSTRAINT checkouts_no_show_fee_lease_whole CHECK (
        (no_show_fee_lease_owner IS NULL) = (no_show_fee_lease_until IS NULL));

-- The worker's claim: due charges by when they are due (one index range).
CREATE INDEX checkouts_no_show_fees_due ON checkouts (no_show_fee_next_at) WHERE no_show_fee_status = 'due';

-- A payment's off-session role: 'setup' (a purchase whose card the PSP saves for off-session use:
-- the customer accepted a no-show fee) or 'charge' (charged without the customer, on the card
-- saved for psp_customer). NULL: an ordinary payment.
ALTER TABLE payments
    ADD COLUMN off_session text CONSTRAINT payments_off_session_check CHECK (off_session IN ('setup', 'charge')),
    ADD COLUMN psp_customer text CONSTRAINT payments_psp_customer_check CHECK (length(psp_customer) <= 64),
    ADD CONSTRAINT payments_off_session_customer CHECK ((off_session = 'charge') = (psp_customer IS NOT NULL));

ALTER TABLE merchant_events DROP CONSTRAINT merchant_events_type_check;
ALTER TABLE merchant_events ADD CONSTRAINT merchant_events_type_check CHECK (type IN (
    'checkout.completed', 'booking.confirmed', 'codes.delivered', 'checkout.refunded', 'booking.cancelled',
    'booking.rescheduled', 'stock.low', 'code.claimed', 'code.replaced', 'code.claim_rejected',
    'code.claim_refunded', 'batch.quarantined', 'payment.disputed', 'payment.dispute_closed',
    'booking.created_by_staff', 'booking.paid_at_venue', 'booking.no_show',
    'booking.no_show_fee_charged', 'booking.no_show_fee_declined'));

-- The fee's outcome is a merchant event too (checkouts_staff_events), written by its statement.
DROP TRIGGER checkouts_staff_events ON checkouts;
CREATE TRIGGER checkouts_staff_events AFTER UPDATE OF state, venue_status, no_show_at, no_show_fee_status ON checkouts
    FOR EACH ROW WHEN (NEW.created_by IS NOT NULL OR NEW.no_show_at IS NOT NULL)
    EXECUTE FUNCTION checkouts_staff_events();

-- The fee's timeline events (source 'no_show_fee': due, charged, declined) beside its payment's own.
ALTER TABLE payment_events DROP CONSTRAINT payment_events_source_check;
-- As in 0011: a partition may hold its own copy of the old CHECK, which the parent's DROP leaves.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.conrelid::regclass AS t FROM pg_constraint c JOIN pg_inherits i ON i.inhrelid = c.conrelid
             WHERE i.inhparent = 'payment_events'::regclass AND c.conname = 'payment_events_source_check' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT payment_events_source_check', r.t);
    END LOOP;
END $$;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_source_check
    CHECK (source IN ('sync', 'webhook', 'reconcile', 'saga', 'claim', 'dispute', 'no_show_fee'));
