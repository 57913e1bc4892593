-- The held holds in a table of their own, as payments keeps its live sagas and payments (docs/booking.md,
-- "The sweeper"): the hold sweeper's claim reads it instead of `holds_held_expiry`, a partial index of
-- `holds` that keeps a dead entry for every hold confirmed, released or expired until a VACUUM of the
-- whole table (the weeks of holds the retention keeps), at the head of the index where every sweep
-- starts. `holds` stays the truth; this mirrors a held hold's expiry in the statement that changes
-- the hold (holds_live_keep), and the sweeper re-checks the hold on the row it locks
-- (booking/repository.py SWEEP_EXPIRED). No merchant's data: the sweeper reaches the hold through its
-- Row-Level Security.
CREATE TABLE holds_live (
    hold_id    uuid PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
-- The sweeper's queue: SKIP LOCKED walks it from the oldest expiry.
CREATE INDEX holds_live_expiry ON holds_live (expires_at);

CREATE TRIGGER holds_live_written AFTER INSERT ON holds
    FOR EACH ROW WHEN (NEW.status = 'held') EXECUTE FUNCTION holds_live_keep();
-- Any UPDATE, not `UPDATE OF ...`: that would miss a change made by a BEFORE trigger.
CREATE TRIGGER holds_live_moved AFTER UPDATE ON holds
    FOR EACH ROW WHEN ((NEW.status, NEW.expires_at) IS DISTINCT FROM (OLD.status, OLD.expires_at)
                       AND (NEW.status = 'held' OR OLD.status = 'held'))
    EXECUTE FUNCTION holds_live_keep();
CREATE TRIGGER holds_live_deleted AFTER DELETE ON holds
    FOR EACH ROW WHEN (OLD.status = 'held') EXECUTE FUNCTION holds_live_keep();

-- The held holds at the upgrade.
SELECT set_config('cuty.merchant', '*', true);
INSERT INTO holds_live (hold_id, expires_at) SELECT id, expires_at FROM holds WHERE status = 'held';
SELECT set_config('cuty.merchant', '', true);
-- Vacuumed and analysed by fixed counts, and analysed now (cuty_live_table).
SELECT cuty_live_table('holds_live');

-- Nothing reads holds by expiry any more: this index was the held holds.
DROP INDEX holds_held_expiry;
