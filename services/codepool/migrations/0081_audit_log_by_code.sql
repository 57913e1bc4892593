-- cuty:no-transaction
-- The audit entries that name a code without an order (an admin's reveal, an operator's read, a
-- key rotation), for the incident story (codepool/incident.py TRAIL). Entries of an order (reserve,
-- deliver, release, expire, the buyer's reads: the hot path) are found by audit_log_by_order and
-- stay out of this index.
-- audit_log is partitioned by time (0030), which builds this index with the partitioned table; a
-- partitioned table's index cannot be built CONCURRENTLY, and where it exists this is a no-op.
CREATE INDEX IF NOT EXISTS audit_log_by_code ON audit_log USING gin (code_ids) WHERE order_id IS NULL;
