-- Finished outbound events leave the live tables (docs/webhooks-out.md, "Retention"). The outbox
-- (merchant_events) is the target of the deliveries' foreign key, the deliveries change state (the
-- workers' leases, redelivery) and are deleted with their endpoint, so the live tables are not
-- partitioned themselves: the retention job (cutylib.retention, payments' bootstrap) moves an event
-- whose deliveries all finished (delivered or given up) more than
-- CUTY_MERCHANT_EVENTS_MOVE_AFTER_DAYS ago, with its deliveries and their attempt log, into the
-- three history tables below, in bounded batches (merchant_events_move, one transaction each). The
-- histories leave whole, by time partition, past CUTY_OUTBOUND_HISTORY_RETENTION_DAYS (one setting:
-- an event and its deliveries move together, so their partitions are the same months).
--
-- Each history: every column of its live table, in the same order (not its CHECKs: the history
-- keeps what the live table accepted), and when it moved, the partition key. No foreign keys (an
-- event's rows move in one transaction and leave by the same month). Append-only, merchants' tables.
CREATE TABLE merchant_events_history (LIKE merchant_events INCLUDING DEFAULTS,
                                      moved_at timestamptz NOT NULL DEFAULT clock_timestamp())
    PARTITION BY RANGE (moved_at);
ALTER TABLE merchant_events_history ADD PRIMARY KEY (merchant_id, id, moved_at);

CREATE TABLE webhook_deliveries_history (LIKE webhook_deliveries INCLUDING DEFAULTS,
                                         moved_at timestamptz NOT NULL DEFAULT clock_timestamp())
    PARTITION BY RANGE (moved_at);
ALTER TABLE webhook_deliveries_history ADD PRIMARY KEY (merchant_id, id, moved_at);
-- An endpoint's delivery log, newest first (ListDeliveries reads both tables).
CREATE INDEX webhook_deliveries_history_log ON webhook_deliveries_history (merchant_id, endpoint_id, seq DESC);

CREATE TABLE webhook_attempts_history (LIKE webhook_attempts INCLUDING DEFAULTS,
                                       moved_at timestamptz NOT NULL DEFAULT clock_timestamp())
    PARTITION BY RANGE (moved_at);
ALTER TABLE webhook_attempts_history ADD PRIMARY KEY (merchant_id, delivery_id, attempt, moved_at);

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['merchant_events_history', 'webhook_deliveries_history', 'webhook_attempts_history'] LOOP
        EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW EXECUTE FUNCTION '
                       'refuse_change(%L)', t || '_append_only', t, 'history is append-only; a partition leaves whole');
        EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION '
                       'refuse_change(%L)', t || '_no_truncate', t, 'history is append-only; a partition leaves whole');
        PERFORM cuty_tenant_table(t::regclass);
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)', t || '_legacy', t);
        PERFORM cuty_tenant_rls((t || '_legacy')::regclass);
        PERFORM cuty_partition_adopt(t::regclass, (t || '_legacy')::regclass, 30, 2);
    END LOOP;
END
$$;

-- The mover's walk (oldest events first) and its look at each one's deliveries.
CREATE INDEX merchant_events_created ON merchant_events (created_at);
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (merchant_id, event_id);

-- An event stays append-only: never changed, and deleted only by moving into its history.
DROP TRIGGER merchant_events_append_only ON merchant_events;
CREATE TRIGGER merchant_events_append_only BEFORE UPDATE ON merchant_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_append_only();
CREATE TRIGGER merchant_events_delete_moved AFTER DELETE ON merchant_events REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION cuty_delete_moved('merchant_events_history', 'merchant_id', 'id');
