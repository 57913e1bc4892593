-- The payment timeline partitioned by time (docs/payments.md, "Retention"): payment_events becomes a
-- table PARTITIONED BY RANGE (created_at), so the retention job (cutylib.retention) removes a month
-- of events whole, by detaching its partition (then archiving and dropping it), and the append-only
-- trigger never lets a row out one by one. The rows there are stay where they are: the old table is
-- attached as the partition `payment_events_legacy` of everything before the next month's start,
-- and leaves whole like any other once that is past the retention. The primary key takes the
-- partition key (a partitioned table's unique keys must hold it); seq stays unique on its own
-- through its sequence. Nothing references payment_events; its own reference to payments stays.
LOCK TABLE payment_events IN ACCESS EXCLUSIVE MODE;
ALTER TABLE payment_events RENAME TO payment_events_legacy;
ALTER TABLE payment_events_legacy DROP CONSTRAINT payment_events_pkey;
ALTER INDEX payment_events_payment RENAME TO payment_events_legacy_payment;
ALTER INDEX payment_events_checkout RENAME TO payment_events_legacy_checkout;
DROP TRIGGER payment_events_append_only ON payment_events_legacy;
DROP TRIGGER payment_events_merchant ON payment_events_legacy;
DROP TRIGGER merchant_immutable ON payment_events_legacy;
-- It keeps its Row-Level Security and policy (a partition is a table the services' role may name);
-- the parent's merchant_immutable trigger replaces its own when it is attached.

CREATE TABLE payment_events (LIKE payment_events_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (created_at);
ALTER SEQUENCE payment_events_seq_seq OWNED BY payment_events.seq;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_pkey PRIMARY KEY (seq, created_at);
ALTER TABLE payment_events ADD CONSTRAINT payment_events_payment_id_fkey
    FOREIGN KEY (payment_id) REFERENCES payments (id);
CREATE INDEX payment_events_payment ON payment_events (merchant_id, payment_id, seq) WHERE payment_id IS NOT NULL;
CREATE INDEX payment_events_checkout ON payment_events (checkout_id, seq) WHERE checkout_id IS NOT NULL;
CREATE TRIGGER payment_events_append_only BEFORE UPDATE OR DELETE ON payment_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_append_only();
CREATE TRIGGER payment_events_no_truncate BEFORE TRUNCATE ON payment_events
    FOR EACH STATEMENT EXECUTE FUNCTION payment_events_append_only();
CREATE TRIGGER payment_events_merchant BEFORE INSERT ON payment_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_merchant();
SELECT cuty_tenant_table('payment_events');

SELECT cuty_partition_adopt('payment_events', 'payment_events_legacy', 30, 2);
