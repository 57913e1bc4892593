-- The delivery workers' claim costs what is due, not how many merchants subscribe (docs/webhooks-out.md,
-- "What a claim costs"). Before, the claim probed every endpoint of every merchant for a due
-- delivery on each poll of each worker: one probe per endpoint, due or not. Now one row per merchant
-- that has a pending delivery says from when its deliveries may be claimable (`due_at`), and the
-- claim starts from the rows due now, through `webhook_merchants_due_at`.
--
-- The rule every writer keeps: a merchant with a pending delivery has a row, and its due_at is no
-- later than the first moment one of its deliveries may be claimed.
--   * A delivery that becomes due sooner (written, redelivered, retried after a failed attempt)
--     marks its merchant in the same statement (the triggers below; webhook_merchant_due): the mark
--     is made due by then, and held FOR SHARE until the transaction ends, so no worker moves it
--     later before the delivery is visible to it.
--   * An endpoint whose circuit closes early (a success) marks its merchant due now.
--   * A worker moves a mark later, or removes it when nothing is pending, only for marks it holds
--     FOR NO KEY UPDATE (SKIP LOCKED: a mark a writer holds is left due), and computes the new
--     due_at in a later statement, which sees every delivery committed before it took the lock
--     (payments/outbound/repository.py, CLAIM_MERCHANTS then REARM).
-- Leases need no mark of their own: a leased delivery's next_attempt_at is its lease's end, which
-- the re-arm counts. A merchant whose due work waits on its caps keeps a due mark (it is work due).
CREATE TABLE webhook_merchants_due (
    merchant_id text PRIMARY KEY CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    due_at      timestamptz NOT NULL,
    -- When a worker last re-computed due_at: the re-arm takes the marks it saw least recently first.
    checked_at  timestamptz
);
CREATE INDEX webhook_merchants_due_at ON webhook_merchants_due (due_at);
SELECT cuty_tenant_table('webhook_merchants_due');

CREATE TRIGGER webhook_deliveries_due AFTER INSERT ON webhook_deliveries
    FOR EACH ROW WHEN (NEW.next_attempt_at IS NOT NULL) EXECUTE FUNCTION webhook_deliveries_due();
CREATE TRIGGER webhook_deliveries_due_sooner AFTER UPDATE OF next_attempt_at ON webhook_deliveries
    FOR EACH ROW WHEN (NEW.next_attempt_at IS NOT NULL
                       AND (OLD.next_attempt_at IS NULL OR NEW.next_attempt_at < OLD.next_attempt_at))
    EXECUTE FUNCTION webhook_deliveries_due();
CREATE TRIGGER webhook_endpoints_circuit_closed AFTER UPDATE OF circuit_open_until ON webhook_endpoints
    FOR EACH ROW WHEN (OLD.circuit_open_until IS NOT NULL
                       AND (NEW.circuit_open_until IS NULL OR NEW.circuit_open_until < OLD.circuit_open_until))
    EXECUTE FUNCTION webhook_endpoints_circuit_closed();

-- The delivery gauges count the open circuits (repository.GAUGES) through the endpoints that have
-- one, not every endpoint.
CREATE INDEX webhook_endpoints_circuit ON webhook_endpoints (circuit_open_until) WHERE circuit_open_until IS NOT NULL;

-- The delivery role keeps the marks (its attempts' retries mark; its claims move and remove them).
GRANT SELECT, INSERT, DELETE ON webhook_merchants_due TO payments_webhooks_out;
GRANT UPDATE (due_at, checked_at) ON webhook_merchants_due TO payments_webhooks_out;

-- The deliveries pending at the upgrade, due from their first next attempt.
SELECT set_config('cuty.merchant', '*', true);
INSERT INTO webhook_merchants_due (merchant_id, due_at)
SELECT merchant_id, min(next_attempt_at) FROM webhook_deliveries WHERE next_attempt_at IS NOT NULL GROUP BY merchant_id;
SELECT set_config('cuty.merchant', '', true);
