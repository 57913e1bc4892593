-- cuty:no-transaction
-- The same question for a payment's own refund id (payments refunded in full by the saga).
CREATE INDEX CONCURRENTLY IF NOT EXISTS payments_by_psp_refund_id ON payments (psp_refund_id)
    WHERE psp_refund_id IS NOT NULL;
