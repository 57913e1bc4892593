-- Finished holds leave the live table (docs/booking.md, "Retention"). `holds` keeps its global keys
-- (the hold id every RPC names, the request-id idempotency key, the no-overlap constraint), so it is
-- not partitioned itself: the retention job (cutylib.retention, booking's bootstrap) moves the holds
-- that finished more than CUTY_HOLDS_MOVE_AFTER_DAYS ago (released or expired ones by their last
-- change, confirmed bookings once their time is over) into `holds_history`, in bounded batches
-- (holds_move), and the history leaves whole by time partition past
-- CUTY_HOLDS_HISTORY_RETENTION_DAYS, archived to a file first when asked.

-- The history: every column of holds (the generated `during` as a plain copy), in the same order
-- (not its CHECKs: the history keeps what the live table accepted, whatever they become later),
-- and when it moved: the partition key, so a moved row always lands in a partition made ahead
-- (a confirmed booking's own time may be far from now). Append-only.
CREATE TABLE holds_history (LIKE holds INCLUDING DEFAULTS,
                            moved_at timestamptz NOT NULL DEFAULT clock_timestamp())
    PARTITION BY RANGE (moved_at);
ALTER TABLE holds_history ALTER COLUMN status DROP DEFAULT, ALTER COLUMN created_at DROP DEFAULT,
    ALTER COLUMN updated_at DROP DEFAULT;
ALTER TABLE holds_history ADD CONSTRAINT holds_history_pkey PRIMARY KEY (id, moved_at);
-- GetHold of a moved hold (one probe per partition).
CREATE INDEX holds_history_id ON holds_history (id);
-- A salon's past days (ListBookings): the same key and predicate as holds_agenda.
CREATE INDEX holds_history_agenda ON holds_history (merchant_id, salon_id, start_time, resource_id, id)
    WHERE status IN ('held', 'confirmed');
CREATE TRIGGER holds_history_append_only BEFORE UPDATE OR DELETE ON holds_history FOR EACH ROW
    EXECUTE FUNCTION refuse_change('the holds history is append-only; a partition leaves whole');
CREATE TRIGGER holds_history_no_truncate BEFORE TRUNCATE ON holds_history FOR EACH STATEMENT
    EXECUTE FUNCTION refuse_change('the holds history is append-only; a partition leaves whole');
SELECT cuty_tenant_table('holds_history');
CREATE TABLE holds_history_legacy (LIKE holds_history INCLUDING DEFAULTS);
SELECT cuty_tenant_rls('holds_history_legacy');
SELECT cuty_partition_adopt('holds_history', 'holds_history_legacy', 30, 2);

-- The mover's two walks, each over the finished holds only, oldest first (its cost is its batch).
CREATE INDEX holds_finished ON holds (updated_at) WHERE status IN ('released', 'expired');
CREATE INDEX holds_booked_until ON holds (end_time) WHERE status = 'confirmed';

-- A hold leaves only by moving: any other DELETE is refused.
CREATE TRIGGER holds_delete_moved AFTER DELETE ON holds REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION cuty_delete_moved('holds_history', 'id');
