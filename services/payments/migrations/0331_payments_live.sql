-- The payments not final in a table of their own, as 0330 did for the sagas (docs/payments.md,
-- "The live payments"): the reconciler's claim and the payments gauge read it instead of
-- `payments_reconcile_due`, a partial index of `payments` whose dead entries (each payment leaves
-- one behind at every change of its status or its next reconcile) only a VACUUM of the whole
-- history removes. `payments` stays the truth; this mirrors status, reconcile_at and the times in
-- the statement that changes a payment (payments_live_keep), and the claim re-checks the payment's
-- own status and reconcile time on the row it locks (repository.py CLAIM_RECONCILE). No merchant's
-- data: a reader reaches the payment through its Row-Level Security.
CREATE TABLE payments_live (
    payment_id   uuid PRIMARY KEY,
    status       text NOT NULL,
    reconcile_at timestamptz,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
-- The reconciler's queue: SKIP LOCKED walks it from the oldest due payment.
CREATE INDEX payments_live_due ON payments_live (reconcile_at);

CREATE TRIGGER payments_live_written AFTER INSERT ON payments
    FOR EACH ROW WHEN (NEW.status IN ('created', 'requires_action', 'processing')) EXECUTE FUNCTION payments_live_keep();
-- Any UPDATE, not `UPDATE OF ...`: that would miss a change made by a BEFORE trigger.
CREATE TRIGGER payments_live_moved AFTER UPDATE ON payments
    FOR EACH ROW WHEN ((NEW.status, NEW.reconcile_at, NEW.updated_at) IS DISTINCT FROM
                       (OLD.status, OLD.reconcile_at, OLD.updated_at)
                       AND (NEW.status IN ('created', 'requires_action', 'processing') OR OLD.status IN ('created', 'requires_action', 'processing')))
    EXECUTE FUNCTION payments_live_keep();
CREATE TRIGGER payments_live_deleted AFTER DELETE ON payments
    FOR EACH ROW WHEN (OLD.status IN ('created', 'requires_action', 'processing')) EXECUTE FUNCTION payments_live_keep();

-- The live payments at the upgrade.
SELECT set_config('cuty.merchant', '*', true);
INSERT INTO payments_live (payment_id, status, reconcile_at, created_at, updated_at)
SELECT id, status, reconcile_at, created_at, updated_at FROM payments WHERE status IN ('created', 'requires_action', 'processing');
SELECT set_config('cuty.merchant', '', true);
-- Vacuumed and analysed by fixed counts, and analysed now (cuty_live_table).
SELECT cuty_live_table('payments_live');

-- Nothing reads payments by their next reconcile any more: this index was the live payments.
DROP INDEX payments_reconcile_due;
