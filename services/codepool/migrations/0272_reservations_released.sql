-- cuty:no-transaction
-- The order mover's walk over released orders (reservations_move), as 0271 over delivered ones.
CREATE INDEX CONCURRENTLY IF NOT EXISTS reservations_released ON reservations (released_at)
    WHERE status = 'released';
