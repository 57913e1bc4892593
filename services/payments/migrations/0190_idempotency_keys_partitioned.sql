-- The checkout API's Idempotency-Keys partitioned by time (docs/checkout.md, "Idempotency-Key"):
-- checkout_idempotency_keys becomes a table PARTITIONED BY RANGE (created_at) in one-day
-- partitions, so the retention job (cutylib.retention, CUTY_CHECKOUT_IDEMPOTENCY_KEYS_RETENTION_DAYS)
-- removes a day of dead keys whole, by detaching and dropping its partition, instead of the batched
-- DELETE that purged them row by row. The rows there are stay where they are: the old table is
-- attached as the partition `checkout_idempotency_keys_legacy` of everything before tomorrow (UTC)
-- and leaves whole once that is past the retention.
--
-- A partitioned table's unique keys must hold the partition key, so the primary key becomes
-- (customer_id, operation, key, created_at): it names one use of a key. That a key has at most one
-- live use (unexpired: within CUTY_IDEMPOTENCY_TTL_SECONDS of its first request) across the
-- partitions is kept by checkout_key_begin, the one statement that starts a use, under the key's
-- advisory lock. A key used again after it expired starts a new row (in today's partition); its
-- dead row stays, read by nobody, until its partition leaves. Nothing references this table.
LOCK TABLE checkout_idempotency_keys IN ACCESS EXCLUSIVE MODE;
ALTER TABLE checkout_idempotency_keys RENAME TO checkout_idempotency_keys_legacy;
ALTER TABLE checkout_idempotency_keys_legacy DROP CONSTRAINT checkout_idempotency_keys_pkey;
-- The purge's index: nothing is purged row by row any more.
DROP INDEX checkout_idempotency_keys_expiry;

CREATE TABLE checkout_idempotency_keys (LIKE checkout_idempotency_keys_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (created_at);
ALTER TABLE checkout_idempotency_keys ADD CONSTRAINT checkout_idempotency_keys_pkey
    PRIMARY KEY (customer_id, operation, key, created_at);
-- The operator's lookup by a key alone (`python -m payments ops story <key>`): a key is unique per
-- customer only, so it is found through its own index, one probe per partition.
CREATE INDEX checkout_idempotency_keys_by_key ON checkout_idempotency_keys (key);

SELECT cuty_partition_adopt('checkout_idempotency_keys', 'checkout_idempotency_keys_legacy', 1, 3);
