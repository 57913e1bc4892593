-- The audit entries that name a code without an order (an admin's reveal, an operator's read, a
-- key rotation), for the incident story (codepool/incident.py TRAIL). Entries of an order (reserve,
-- deliver, release, expire, the buyer's reads: the hot path) are found by audit_log_by_order and
-- stay out of this index.
-- The audit log is partitioned by time (0030): PostgreSQL builds a partitioned table's index on each
-- partition and gives every later partition its own, and refuses CONCURRENTLY on a partitioned table.
-- The partitions the retention job keeps ahead are empty, so the build blocks only the filled ones.
CREATE INDEX IF NOT EXISTS audit_log_by_code ON audit_log USING gin (code_ids) WHERE order_id IS NULL;
