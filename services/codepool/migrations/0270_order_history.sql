-- Finished orders leave the live tables (docs/codepool.md, "Retention"). `reservations` keeps its
-- global key (the order id every system RPC names), and `deliveries`, `payment_transactions` and
-- `code_claims` reference it, so none of them is partitioned itself: the retention job
-- (cutylib.retention, the code pool's bootstrap) moves an order that finished more than
-- CUTY_RESERVATIONS_MOVE_AFTER_DAYS ago (delivered, or released) and has no unresolved claim, with
-- its deliveries and payment transactions, into the three histories below in one transaction
-- (reservations_move), in bounded batches; the histories leave whole by time partition past
-- CUTY_CODEPOOL_HISTORY_RETENTION_DAYS, archived to a file first when asked. The codes themselves
-- stay in `codes` (the per-product duplicate check by keyed hash must keep seeing every code ever
-- sold, and claims reference them); a delivered code's orders are found in deliveries and the history.

-- The histories: every column of the live table, in the same order (not its CHECKs: the history keeps
-- what the live table accepted), then when it moved: the partition key, so a moved row always lands in
-- a partition made ahead. Append-only.
CREATE TABLE reservations_history (LIKE reservations, moved_at timestamptz NOT NULL DEFAULT clock_timestamp())
    PARTITION BY RANGE (moved_at);
ALTER TABLE reservations_history ADD CONSTRAINT reservations_history_pkey PRIMARY KEY (order_id, moved_at);
-- GetReservation, DeliverCodes and ReleaseReservation of a moved order, the buyer's codes, the
-- incident story and the chargeback evidence: by order id (one probe per partition).
CREATE INDEX reservations_history_order ON reservations_history (order_id);
-- The auditor's digest: the same key and predicate as reservations_digest.
CREATE INDEX reservations_history_digest ON reservations_history (reserved_at, order_id) WHERE status = 'delivered';

CREATE TABLE deliveries_history (LIKE deliveries, moved_at timestamptz NOT NULL DEFAULT clock_timestamp())
    PARTITION BY RANGE (moved_at);
ALTER TABLE deliveries_history ADD CONSTRAINT deliveries_history_pkey PRIMARY KEY (id, moved_at);
CREATE INDEX deliveries_history_by_order ON deliveries_history (merchant_id, order_id);
-- Every order a code went to (the incident story, the digest's codes sold twice).
CREATE INDEX deliveries_history_by_code ON deliveries_history (merchant_id, code_id);

CREATE TABLE payment_transactions_history (LIKE payment_transactions,
                                           moved_at timestamptz NOT NULL DEFAULT clock_timestamp())
    PARTITION BY RANGE (moved_at);
ALTER TABLE payment_transactions_history ADD CONSTRAINT payment_transactions_history_pkey
    PRIMARY KEY (merchant_id, transaction_id, moved_at);

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['reservations_history', 'deliveries_history', 'payment_transactions_history'] LOOP
        EXECUTE format('CREATE TRIGGER %1$I BEFORE UPDATE OR DELETE ON %2$I FOR EACH ROW EXECUTE FUNCTION '
                       'refuse_change(%3$L)', t || '_append_only', t,
                       'the order history is append-only; a partition leaves whole');
        EXECUTE format('CREATE TRIGGER %1$I BEFORE TRUNCATE ON %2$I FOR EACH STATEMENT EXECUTE FUNCTION '
                       'refuse_change(%3$L)', t || '_no_truncate', t,
                       'the order history is append-only; a partition leaves whole');
        PERFORM cuty_tenant_table(t);
        EXECUTE format('CREATE TABLE %1$I (LIKE %2$I INCLUDING DEFAULTS)', t || '_legacy', t);
        PERFORM cuty_tenant_rls((t || '_legacy')::regclass);
        PERFORM cuty_partition_adopt(t::regclass, (t || '_legacy')::regclass, 30, 2);
    END LOOP;
END $$;

-- An order leaves only by moving: the row triggers that refused every DELETE give way to the
-- delete guard, which refuses any DELETE of a row the history does not hold.
DROP TRIGGER reservations_no_delete ON reservations;
DROP TRIGGER deliveries_no_delete ON deliveries;
DROP TRIGGER payment_transactions_no_delete ON payment_transactions;
CREATE TRIGGER reservations_delete_moved AFTER DELETE ON reservations REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION cuty_delete_moved('reservations_history', 'order_id');
CREATE TRIGGER deliveries_delete_moved AFTER DELETE ON deliveries REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION cuty_delete_moved('deliveries_history', 'id');
CREATE TRIGGER payment_transactions_delete_moved AFTER DELETE ON payment_transactions REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION cuty_delete_moved('payment_transactions_history', 'merchant_id',
                                                          'transaction_id');

-- A claim outlives its order's move (a resolved claim is final; an order with an unresolved one
-- does not move). Its order is checked where the claim is opened (codepool_claim_open, under the
-- reservation row's key-share lock, which the mover's FOR UPDATE SKIP LOCKED passes by).
ALTER TABLE code_claims DROP CONSTRAINT code_claims_order_fkey;

-- Readers that must find a moved order read both: the live rows (moved_at NULL), then the moved ones.
-- security_invoker: the caller's Row-Level Security applies. A column added to the live table is
-- added to its history and these views are re-created (a test checks the columns match).
CREATE VIEW reservations_all WITH (security_invoker = true) AS
    SELECT r.*, NULL::timestamptz AS moved_at FROM reservations r
    UNION ALL SELECT h.* FROM reservations_history h;
CREATE VIEW deliveries_all WITH (security_invoker = true) AS
    SELECT d.*, NULL::timestamptz AS moved_at FROM deliveries d
    UNION ALL SELECT h.* FROM deliveries_history h;
CREATE VIEW payment_transactions_all WITH (security_invoker = true) AS
    SELECT t.*, NULL::timestamptz AS moved_at FROM payment_transactions t
    UNION ALL SELECT h.* FROM payment_transactions_history h;
