-- A merchant's ListCheckouts filtered by state walked the merchant's whole list
-- (checkouts_merchant_list) and dropped the other states' rows: a page of a rare state (REFUNDED,
-- NEEDS_ATTENTION) read the merchant's history back to the 50th match, a cost that grows with the
-- table (`make bench-growth`, docs/benchmarks.md). With the state in the key the page reads its rows
-- alone. The list's keyset order stays (created_at DESC, id DESC).
CREATE INDEX checkouts_merchant_state ON checkouts (merchant_id, state, created_at DESC, id DESC)
    WHERE merchant_id IS NOT NULL;
