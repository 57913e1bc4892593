-- cuty:no-transaction
-- The invariant auditor's per-bucket summary of holds (booking/digest.py SUMMARY): a window of
-- confirmed holds not cancelled by creation, with the facts it hashes, read from the index alone
-- (an index-only scan: no heap page per hold). Built without blocking the serving version's writes
-- (docs/deploy.md, "Schema changes while the old version serves").
CREATE INDEX CONCURRENTLY IF NOT EXISTS holds_summary ON holds (created_at) INCLUDE (id, payment_ref, merchant_id)
    WHERE status = 'confirmed' AND cancelled_at IS NULL;
