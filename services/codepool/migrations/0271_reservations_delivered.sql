-- cuty:no-transaction
-- The order mover's walk over delivered orders (reservations_move), oldest first, so a batch costs
-- its rows, not the table. Built without blocking the serving version's writes (docs/deploy.md,
-- "Schema changes while the old version serves").
CREATE INDEX CONCURRENTLY IF NOT EXISTS reservations_delivered ON reservations (delivered_at)
    WHERE status = 'delivered';
