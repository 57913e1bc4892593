-- Staff book for a customer (docs/checkout.md, "Staff book for a customer"): a checkout made by a
-- merchant's staff for a named customer, paid through a payment link (the PSP's hosted page) or at
-- the venue; bookings marked paid at the venue or no-show; and the customers staff name by contact.

-- A customer known only by a contact (a phone call, a walk-in): one row per merchant and contact
-- (the phone in E.164, else the e-mail lower-cased), so the same caller is the same customer and
-- their no-shows add up. Their checkouts' customer_id is 'guest:' || id.
CREATE TABLE guest_customers (
    merchant_id text NOT NULL,
    id          uuid NOT NULL DEFAULT gen_random_uuid(),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    phone       text CHECK (phone ~ '^\+[1-9][0-9]{6,14}$'),
    email       text CHECK (length(email) <= 254 AND email ~ '^[^@[:space:]]+@[^@[:space:]]+\.[^@[:space:]]+$'),
    contact     text GENERATED ALWAYS AS (COALESCE(phone, lower(email))) STORED,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (merchant_id, id),
    CONSTRAINT guest_customers_contact_given CHECK (phone IS NOT NULL OR email IS NOT NULL),
    CONSTRAINT guest_customers_contact_key UNIQUE (merchant_id, contact)
);
SELECT cuty_tenant_table('guest_customers');

-- How a staff-made checkout is paid: 'link' (the customer pays on the PSP's hosted page; the hold
-- lasts link_ttl_seconds from the hold, the link's life: its expire_time is the link's expiry) or
-- 'venue' (confirmed unpaid; staff mark it paid). NULL: the customer's own checkout, paid online.
ALTER TABLE checkouts
    ADD COLUMN settle text CONSTRAINT checkouts_settle_check CHECK (settle IN ('link', 'venue')),
    ADD COLUMN created_by text,
    ADD COLUMN link_ttl_seconds int CONSTRAINT checkouts_link_ttl_check CHECK (link_ttl_seconds BETWEEN 1 AND 86400),
    ADD COLUMN venue_status text CONSTRAINT checkouts_venue_status_check CHECK (venue_status IN ('unpaid', 'paid')),
    ADD COLUMN venue_method text CONSTRAINT checkouts_venue_method_check CHECK (venue_method IN ('cash', 'card_terminal')),
    ADD COLUMN venue_amount_minor bigint CONSTRAINT checkouts_venue_amount_check CHECK (venue_amount_minor >= 0),
    ADD COLUMN venue_reference text,
    ADD COLUMN venue_paid_by text,
    ADD COLUMN venue_paid_at timestamptz,
    ADD COLUMN no_show_at timestamptz,
    ADD COLUMN no_show_by text,
    ADD CONSTRAINT checkouts_staff_made CHECK ((settle IS NULL) = (created_by IS NULL)),
    ADD CONSTRAINT checkouts_link_expiry CHECK ((settle = 'link') = (link_ttl_seconds IS NOT NULL)),
    ADD CONSTRAINT checkouts_venue_unpaid CHECK ((settle = 'venue') = (venue_status IS NOT NULL)),
    ADD CONSTRAINT checkouts_venue_paid CHECK (
        (venue_status = 'paid') = (venue_method IS NOT NULL AND venue_amount_minor IS NOT NULL
                                   AND venue_reference IS NOT NULL AND venue_paid_at IS NOT NULL)),
    ADD CONSTRAINT checkouts_no_show CHECK ((no_show_at IS NULL) = (no_show_by IS NULL)),
    -- A customer who came and paid did show.
    ADD CONSTRAINT checkouts_paid_or_no_show CHECK (NOT (venue_status = 'paid' AND no_show_at IS NOT NULL));

-- No-shows counted per customer (one index probe per count).
CREATE INDEX checkouts_no_shows ON checkouts (merchant_id, customer_id) WHERE no_show_at IS NOT NULL;

ALTER TABLE merchant_events DROP CONSTRAINT merchant_events_type_check;
ALTER TABLE merchant_events ADD CONSTRAINT merchant_events_type_check CHECK (type IN (
    'checkout.completed', 'booking.confirmed', 'codes.delivered', 'checkout.refunded', 'booking.cancelled',
    'booking.rescheduled', 'stock.low', 'code.claimed', 'code.replaced', 'code.claim_rejected',
    'code.claim_refunded', 'batch.quarantined', 'payment.disputed', 'payment.dispute_closed',
    'booking.created_by_staff', 'booking.paid_at_venue', 'booking.no_show'));

-- booking.created_by_staff (the hold taken), booking.paid_at_venue, booking.no_show: written by the
-- statement that makes the change (checkouts_staff_events).
CREATE TRIGGER checkouts_staff_events AFTER UPDATE OF state, venue_status, no_show_at ON checkouts
    FOR EACH ROW WHEN (NEW.created_by IS NOT NULL OR NEW.no_show_at IS NOT NULL)
    EXECUTE FUNCTION checkouts_staff_events();

-- CreateStaffCheckout's Idempotency-Keys (the staff member's key space, operation 'staff-create').
ALTER TABLE checkout_idempotency_keys DROP CONSTRAINT checkout_idempotency_keys_operation_check;
ALTER TABLE checkout_idempotency_keys ADD CONSTRAINT checkout_idempotency_keys_operation_check
    CHECK (operation IN ('create', 'pay', 'reschedule', 'staff-create'));
