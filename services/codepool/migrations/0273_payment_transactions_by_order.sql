-- cuty:no-transaction
-- An order's payment transactions (reservations_move copies and deletes them with their order, and
-- the foreign key's check on deleting a reservation reads them): without this index both scanned the
-- whole table. Built without blocking the serving version's writes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS payment_transactions_by_order ON payment_transactions (merchant_id, order_id);
