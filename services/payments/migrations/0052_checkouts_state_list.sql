-- cuty:no-transaction
-- The operator's list filtered by state, across merchants (ListCheckouts `state` without a merchant).
CREATE INDEX CONCURRENTLY IF NOT EXISTS checkouts_state_list ON checkouts (state, created_at DESC, id DESC);
