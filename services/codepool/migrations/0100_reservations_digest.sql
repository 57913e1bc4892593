-- cuty:no-transaction
-- The invariant auditor's digest (codepool/digest.py): a window of delivered orders by reservation
-- time, in keyset order. Built without blocking the serving version's writes (docs/deploy.md,
-- "Schema changes while the old version serves").
CREATE INDEX CONCURRENTLY IF NOT EXISTS reservations_digest ON reservations (reserved_at, order_id)
    WHERE status = 'delivered';
