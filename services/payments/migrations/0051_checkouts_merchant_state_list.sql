-- cuty:no-transaction
-- A merchant's list filtered by state (ListCheckouts `state`, docs/checkout.md "Lists"): without it a
-- rare state (REFUNDED among a salon chain's years of COMPLETED) walked the merchant's whole history.
CREATE INDEX CONCURRENTLY IF NOT EXISTS checkouts_merchant_state ON checkouts (merchant_id, state, created_at DESC, id DESC)
    WHERE merchant_id IS NOT NULL;
