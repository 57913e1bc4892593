-- A staff-made payment link offers the booking's no-show fee (docs/checkout.md, "No-show fee"):
-- the fee the slot named when staff made the link is the offer; the PSP's hosted page asks the
-- customer to consent to exactly it, and only an accepted offer becomes the checkout's acceptance
-- (no_show_fee_minor, no_show_fee_accepted_at, as a customer's own at PayCheckout).

-- The offer, with the link's checkout alone; what a link's customer accepts is the offer, never
-- another amount.
ALTER TABLE checkouts
    ADD COLUMN no_show_fee_offered_minor bigint,
    ADD CONSTRAINT checkouts_no_show_fee_offer CHECK (
        no_show_fee_offered_minor IS NULL OR (settle IS NOT DISTINCT FROM 'link' AND no_show_fee_offered_minor > 0)),
    ADD CONSTRAINT checkouts_link_fee_is_the_offer CHECK (
        settle IS DISTINCT FROM 'link' OR no_show_fee_minor IS NULL OR no_show_fee_minor = no_show_fee_offered_minor);

-- The link's payment: the amount the hosted page asks consent to (one later off-session charge),
-- with the card saved only if the customer consents ('setup'), on the hosted page alone.
ALTER TABLE payments
    ADD COLUMN consent_minor bigint,
    ADD CONSTRAINT payments_consent CHECK (
        consent_minor IS NULL OR (consent_minor > 0 AND consent_minor <= amount_minor AND off_session IS NOT DISTINCT FROM 'setup'
                                  AND payment_method = 'hosted_page'));
