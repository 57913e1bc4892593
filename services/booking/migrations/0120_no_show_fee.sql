-- A salon's no-show fee (docs/booking.md, "No-show fee"): this percentage of a booking's price is
-- charged off-session when staff mark a no-show, only to a customer who accepted it at purchase
-- (the acceptance and the charge are the payments service's). 0: no fee.
ALTER TABLE salons
    ADD COLUMN no_show_fee_percent integer NOT NULL DEFAULT 0 CHECK (no_show_fee_percent BETWEEN 0 AND 100);
