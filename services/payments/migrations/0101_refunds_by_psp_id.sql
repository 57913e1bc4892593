-- cuty:no-transaction
-- The invariant auditor asks, for each refund the PSP lists in a window, whether it is one of ours
-- (payments/audit.py, "psp_refund_unknown"). Partial: only settled refunds carry a PSP id. Built
-- without blocking the serving version's writes (docs/deploy.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS refunds_by_psp_id ON refunds (psp_refund_id) WHERE psp_refund_id IS NOT NULL;
