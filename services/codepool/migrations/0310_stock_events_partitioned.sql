-- The code pool's outbox of merchant events partitioned by time (docs/codepool.md, "Retention"):
-- stock_events becomes a table PARTITIONED BY RANGE (created_at) in 7-day partitions, so the
-- retention job (cutylib.retention, CUTY_STOCK_EVENTS_RETENTION_DAYS) removes a week of events whole,
-- by detaching (optionally archiving) and dropping its partition; before, nothing ever left it. An
-- event is the outbox's until the orchestrator's relay has stored it in its own merchant events
-- (ListStockEvents(after_seq), payments' outbound_feeds cursor), which it does within seconds; the
-- retention is how long a stopped relay may stay behind.
--
-- The events there are stay where they are, in the partition `stock_events_legacy` of everything
-- before the end of the current week of the grid. A partitioned table's unique keys must hold the
-- partition key: the primary key becomes (seq, created_at), and (merchant_id, id) becomes
-- (merchant_id, id, created_at); seq stays unique on its own through its identity, and an event's id
-- is a fresh random uuid of the one function that writes each kind (codepool_check_stock,
-- codepool_emit_event). The feed reads seq > cursor in seq order: a merge of each partition's
-- primary key, a handful of partitions. Nothing references stock_events; its reference to
-- products stays. The columns and CHECKs (the type list included) are taken from the table as it is.
LOCK TABLE stock_events IN ACCESS EXCLUSIVE MODE;
ALTER TABLE stock_events RENAME TO stock_events_legacy;
ALTER TABLE stock_events_legacy DROP CONSTRAINT stock_events_pkey;
ALTER TABLE stock_events_legacy DROP CONSTRAINT stock_events_merchant_id_id_key;
ALTER TABLE stock_events_legacy DROP CONSTRAINT stock_events_merchant_id_product_id_fkey;
ALTER INDEX stock_events_product RENAME TO stock_events_legacy_product;
DROP TRIGGER stock_events_append_only ON stock_events_legacy;
DROP TRIGGER merchant_immutable ON stock_events_legacy;
-- It keeps its Row-Level Security and policy (a partition is a table the services' role may name);
-- the parent's triggers replace its own when it is attached.

CREATE TABLE stock_events (LIKE stock_events_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY)
    PARTITION BY RANGE (created_at);
-- The identity goes on from the last seq (a partition may not have an identity of its own), so the
-- relay's cursor reads on where it stopped.
SELECT setval(pg_get_serial_sequence('stock_events', 'seq'), greatest(1, (SELECT max(seq) FROM stock_events_legacy)),
              (SELECT max(seq) FROM stock_events_legacy) IS NOT NULL);
ALTER TABLE stock_events_legacy ALTER COLUMN seq DROP IDENTITY;
ALTER TABLE stock_events ADD CONSTRAINT stock_events_pkey PRIMARY KEY (seq, created_at);
ALTER TABLE stock_events ADD CONSTRAINT stock_events_merchant_id_id_key UNIQUE (merchant_id, id, created_at);
ALTER TABLE stock_events ADD CONSTRAINT stock_events_merchant_id_product_id_fkey
    FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id);
CREATE INDEX stock_events_product ON stock_events (merchant_id, product_id, seq);
CREATE TRIGGER stock_events_append_only BEFORE UPDATE OR DELETE ON stock_events FOR EACH ROW
    EXECUTE FUNCTION refuse_change('stock events are history');
CREATE TRIGGER stock_events_no_truncate BEFORE TRUNCATE ON stock_events FOR EACH STATEMENT
    EXECUTE FUNCTION refuse_change('stock events are history; a partition leaves whole');
SELECT cuty_tenant_table('stock_events');

SELECT cuty_partition_adopt('stock_events', 'stock_events_legacy', 7, 4);
