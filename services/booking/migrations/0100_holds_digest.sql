-- cuty:no-transaction
-- The invariant auditor's digest (booking/digest.py): a window of confirmed holds (and those
-- cancelled after purchase) by creation, in keyset order. Partial: held, expired and plainly
-- released holds, most of the table, are not in it. Built without blocking the serving version's
-- writes (docs/deploy.md, "Schema changes while the old version serves").
CREATE INDEX CONCURRENTLY IF NOT EXISTS holds_digest ON holds (created_at, id)
    WHERE status = 'confirmed' OR cancelled_at IS NOT NULL;
