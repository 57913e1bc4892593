-- The PSP's webhook events partitioned by time (docs/payments.md, "Webhooks"): psp_events becomes a
-- table PARTITIONED BY RANGE (received_at) in 7-day partitions, so the retention job
-- (cutylib.retention, CUTY_PSP_EVENT_RETENTION_DAYS) removes a week of events whole, by detaching
-- (optionally archiving) and dropping its partition, instead of the batched DELETE of handled events.
-- The rows there are stay where they are: the old table is attached as the partition
-- `psp_events_legacy` of everything before the end of the current week of the grid, and leaves
-- whole once that is past the retention.
--
-- A partitioned table's unique keys must hold the partition key, so the primary key becomes
-- (event_id, received_at). That an event id is stored once across the partitions (a redelivery is
-- a duplicate) is kept by psp_events_store, the one statement that stores an event, under the
-- event id's advisory lock. Nothing references psp_events; its reference to payments stays.
LOCK TABLE psp_events IN ACCESS EXCLUSIVE MODE;
ALTER TABLE psp_events RENAME TO psp_events_legacy;
ALTER TABLE psp_events_legacy DROP CONSTRAINT psp_events_pkey;
ALTER INDEX psp_events_due RENAME TO psp_events_legacy_due;
ALTER INDEX psp_events_payment RENAME TO psp_events_legacy_payment;
-- The purge's index: nothing is purged row by row any more.
DROP INDEX psp_events_handled;

CREATE TABLE psp_events (LIKE psp_events_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (received_at);
ALTER TABLE psp_events ADD CONSTRAINT psp_events_pkey PRIMARY KEY (event_id, received_at);
ALTER TABLE psp_events ADD CONSTRAINT psp_events_payment_id_fkey FOREIGN KEY (payment_id) REFERENCES payments (id);
CREATE INDEX psp_events_due ON psp_events (next_attempt_at) WHERE status IN ('received', 'deferred');
CREATE INDEX psp_events_payment ON psp_events (payment_id) WHERE payment_id IS NOT NULL;

SELECT cuty_partition_adopt('psp_events', 'psp_events_legacy', 7, 4);
