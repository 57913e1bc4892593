-- The sagas not finished, and those with a next run, in a table of their own, as small as the work
-- in flight (docs/checkout.md, "The live sagas"): the saga workers' claim starts from it, and the
-- stuck-saga gauges and `ops stuck` read it. Before, they read two partial indexes of `checkouts`
-- (`checkouts_due` by next run, `checkouts_live_by_state` by state): every change of a saga leaves a
-- dead entry behind in both, and only a VACUUM of `checkouts` removes them. Autovacuum comes after a
-- fifth of a table has changed, and on a table of millions it may skip the indexes altogether (too
-- few pages with dead rows), so the claim and the gauges read more dead entries the bigger the
-- history grew. This table holds only the live sagas: autovacuum reaches it every round (absolute
-- settings below), and its VACUUM costs what is live, never the history.
--
-- `checkouts` stays the truth every saga statement reads and writes; this table mirrors its state,
-- updated_at and next_run_at in the same statement (sagas_live_keep), and the claim re-checks the
-- checkout's own next run on the row it locks (checkout/repository.py CLAIM_DUE). It names no
-- merchant and holds nothing of one: whoever reads it reaches the checkout through its Row-Level
-- Security.
CREATE TABLE sagas_live (
    checkout_id uuid PRIMARY KEY,
    state       text NOT NULL,
    updated_at  timestamptz NOT NULL,
    next_run_at timestamptz
);
-- The workers' queue: SKIP LOCKED walks it from the oldest due row.
CREATE INDEX sagas_live_due ON sagas_live (next_run_at) WHERE next_run_at IS NOT NULL;
-- The stuck-saga gauges (payments/checkout/metrics.py) and `ops stuck`: per state, the oldest first.
CREATE INDEX sagas_live_by_state ON sagas_live (state, updated_at);

CREATE TRIGGER checkouts_live_written AFTER INSERT ON checkouts
    FOR EACH ROW EXECUTE FUNCTION sagas_live_keep();
-- Any UPDATE, not `UPDATE OF ...`: that would miss a change made by a BEFORE trigger.
CREATE TRIGGER checkouts_live_moved AFTER UPDATE ON checkouts
    FOR EACH ROW WHEN ((NEW.state, NEW.updated_at, NEW.next_run_at) IS DISTINCT FROM
                       (OLD.state, OLD.updated_at, OLD.next_run_at))
    EXECUTE FUNCTION sagas_live_keep();
CREATE TRIGGER checkouts_live_deleted AFTER DELETE ON checkouts
    FOR EACH ROW EXECUTE FUNCTION sagas_live_keep();

-- The live sagas at the upgrade.
SELECT set_config('cuty.merchant', '*', true);
INSERT INTO sagas_live (checkout_id, state, updated_at, next_run_at)
SELECT id, state, updated_at, next_run_at FROM checkouts
WHERE next_run_at IS NOT NULL
   OR state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED', 'CANCELLED_AFTER_PURCHASE');
SELECT set_config('cuty.merchant', '', true);
-- Vacuumed and analysed by fixed counts, and analysed now (cuty_live_table).
SELECT cuty_live_table('sagas_live');

-- Nothing reads checkouts by next run or by live state any more: these indexes were the live sagas.
DROP INDEX checkouts_due;
DROP INDEX checkouts_live_by_state;
