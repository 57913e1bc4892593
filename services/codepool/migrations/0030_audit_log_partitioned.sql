-- The audit log partitioned by time (docs/codepool.md, "Retention"): audit_log becomes a table
-- PARTITIONED BY RANGE (at), so the retention job (cutylib.retention) removes a month of entries
-- whole, by detaching its partition (then archiving and dropping it); the append-only triggers
-- never let an entry out one by one. The entries there are stay where they are, in the partition
-- `audit_log_legacy` of everything before the next month's start. The primary key takes the
-- partition key (a partitioned table's unique keys must hold it); id stays unique on its own
-- through its identity sequence. Nothing references audit_log (its comment: no foreign keys).
-- The columns and CHECKs (the action list included) are taken from the table as it is.
LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE;
ALTER TABLE audit_log RENAME TO audit_log_legacy;
ALTER TABLE audit_log_legacy DROP CONSTRAINT audit_log_pkey;
ALTER INDEX audit_log_by_order RENAME TO audit_log_legacy_by_order;
DROP TRIGGER audit_log_append_only ON audit_log_legacy;
DROP TRIGGER audit_log_no_truncate ON audit_log_legacy;
DROP TRIGGER merchant_immutable ON audit_log_legacy;
-- It keeps its Row-Level Security and policy (a partition is a table the services' role may name);
-- the parent's merchant_immutable trigger replaces its own when it is attached.

CREATE TABLE audit_log (LIKE audit_log_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY)
    PARTITION BY RANGE (at);
-- The identity goes on from the last id (a partition may not have an identity of its own).
SELECT setval(pg_get_serial_sequence('audit_log', 'id'), greatest(1, (SELECT max(id) FROM audit_log_legacy)),
              (SELECT max(id) FROM audit_log_legacy) IS NOT NULL);
ALTER TABLE audit_log_legacy ALTER COLUMN id DROP IDENTITY;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id, at);
CREATE INDEX audit_log_by_order ON audit_log (merchant_id, order_id) WHERE order_id IS NOT NULL;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log FOR EACH ROW
    EXECUTE FUNCTION refuse_change('the audit log is append-only');
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log FOR EACH STATEMENT
    EXECUTE FUNCTION refuse_change('the audit log is append-only');
SELECT cuty_tenant_table('audit_log');

SELECT cuty_partition_adopt('audit_log', 'audit_log_legacy', 30, 2);
