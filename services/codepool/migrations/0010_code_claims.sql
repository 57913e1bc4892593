-- After a code is sold (docs/codepool.md, "Claims, replacement and batch quarantine"):
--   * a buyer's or the merchant's staff's claim on a delivered code ("does not work", "already
--     used"), resolved by an admin: replaced (a new code delivered to the same order, the old one
--     revoked), refunded (the old one revoked), or rejected;
--   * a supplier batch that collects too many claims stops selling: its available codes become
--     quarantined in one statement; an admin releases the batch (back to available) or retires it
--     (its codes revoked).
-- Two code statuses join the table of codes_guard_update: `quarantined` (not sold while its batch
-- is held back) and `revoked` (terminal: never sold again, never shown to the buyer).

ALTER TABLE codes ADD COLUMN revoked_at timestamptz;
ALTER TABLE codes DROP CONSTRAINT codes_status_check, DROP CONSTRAINT codes_check;
ALTER TABLE codes
    ADD CONSTRAINT codes_status_check
        CHECK (status IN ('available', 'reserved', 'delivered', 'quarantined', 'revoked')),
    -- the times follow the status; a revoked code keeps when it was reserved and delivered, if it was
    ADD CONSTRAINT codes_times_check CHECK (CASE status
             WHEN 'available'   THEN reserved_at IS NULL AND delivered_at IS NULL AND revoked_at IS NULL
             WHEN 'quarantined' THEN reserved_at IS NULL AND delivered_at IS NULL AND revoked_at IS NULL
             WHEN 'reserved'    THEN reserved_at IS NOT NULL AND delivered_at IS NULL AND revoked_at IS NULL
             WHEN 'delivered'   THEN reserved_at IS NOT NULL AND delivered_at IS NOT NULL AND revoked_at IS NULL
             ELSE revoked_at IS NOT NULL END);

-- The counters count the two new statuses too (codepool_stock_count); no code has them yet.
ALTER TABLE product_stock
    ADD COLUMN quarantined bigint NOT NULL DEFAULT 0 CHECK (quarantined >= 0),
    ADD COLUMN revoked     bigint NOT NULL DEFAULT 0 CHECK (revoked >= 0);

-- A delivery whose code was taken back (replaced or refunded after a claim): it leaves the partial
-- unique index deliveries_one_active_per_code, and the order's replacement is a delivery of its own.
ALTER TABLE deliveries ADD COLUMN revoked_at timestamptz;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_status_check
    CHECK (status IN ('reserved', 'delivered', 'released', 'revoked'));
ALTER TABLE deliveries ADD CONSTRAINT deliveries_revoked_time CHECK ((status = 'revoked') = (revoked_at IS NOT NULL));
DROP TRIGGER deliveries_transition ON deliveries;
CREATE TRIGGER deliveries_transition BEFORE UPDATE OF status ON deliveries FOR EACH ROW
    EXECUTE FUNCTION enforce_status_transition('reserved>delivered', 'reserved>released', 'delivered>revoked');

-- A product's claims threshold: when the open or upheld claims on one of its batches (since the
-- batch was last released) reach it, the batch is quarantined. NULL: never automatically.
ALTER TABLE products ADD COLUMN claim_quarantine_threshold integer
    CONSTRAINT products_claim_quarantine_threshold_range CHECK (claim_quarantine_threshold BETWEEN 1 AND 1000000);

-- A batch sells (active), is held back (quarantined) or is gone for good (retired).
ALTER TABLE supplier_batches
    ADD COLUMN status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'quarantined', 'retired')),
    ADD COLUMN quarantined_at timestamptz,
    ADD COLUMN released_at timestamptz,
    ADD COLUMN retired_at timestamptz;
CREATE TRIGGER supplier_batches_transition BEFORE UPDATE OF status ON supplier_batches FOR EACH ROW
    EXECUTE FUNCTION enforce_status_transition('active>quarantined', 'quarantined>active', 'quarantined>retired');

-- One claim on one delivered code of one order. The claim id is derived from the caller's
-- Idempotency-Key (a replay finds it); at most one claim per code is unresolved (open, or being
-- refunded) at a time: the partial unique index decides two claims racing.
CREATE TABLE code_claims (
    id                  uuid PRIMARY KEY,
    merchant_id         text NOT NULL,
    product_id          uuid NOT NULL,
    batch_id            uuid NOT NULL,
    code_id             uuid NOT NULL,
    order_id            text NOT NULL,
    customer_id         text NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('does_not_work', 'already_used')),
    reason              text NOT NULL CHECK (length(reason) BETWEEN 1 AND 500),
    status              text NOT NULL DEFAULT 'open'
        CHECK (status IN ('open', 'refunding', 'replaced', 'refunded', 'rejected')),
    opened_by           text NOT NULL,
    opened_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    resolved_by         text,
    resolved_at         timestamptz,
    resolution_note     text CHECK (length(resolution_note) <= 500),
    replacement_code_id uuid,
    refund_minor        bigint CHECK (refund_minor > 0),
    currency            text,
    refund_id           text,
    -- Each refund decision is a new attempt: the orchestrator's refund key names it, so a refund the
    -- PSP refused (the claim reopened) and decided again is a new refund, not the refused one replayed.
    refund_attempt      integer NOT NULL DEFAULT 0 CHECK (refund_attempt >= 0),
    CHECK ((status = 'open') = (resolved_by IS NULL)),
    CHECK ((status IN ('replaced', 'refunded', 'rejected')) = (resolved_at IS NOT NULL)),
    CHECK ((status = 'replaced') = (replacement_code_id IS NOT NULL)),
    CHECK (status NOT IN ('refunding', 'refunded') OR (refund_minor IS NOT NULL AND currency IS NOT NULL)),
    CHECK ((status = 'refunded') = (refund_id IS NOT NULL)),
    CONSTRAINT code_claims_code_fkey FOREIGN KEY (merchant_id, product_id, code_id)
        REFERENCES codes (merchant_id, product_id, id),
    CONSTRAINT code_claims_replacement_fkey FOREIGN KEY (merchant_id, product_id, replacement_code_id)
        REFERENCES codes (merchant_id, product_id, id),
    CONSTRAINT code_claims_batch_fkey FOREIGN KEY (merchant_id, product_id, batch_id)
        REFERENCES supplier_batches (merchant_id, product_id, id),
    CONSTRAINT code_claims_order_fkey FOREIGN KEY (merchant_id, order_id) REFERENCES reservations (merchant_id, order_id)
);
CREATE UNIQUE INDEX code_claims_one_open_per_code ON code_claims (merchant_id, code_id)
    WHERE status IN ('open', 'refunding');
CREATE INDEX code_claims_by_batch ON code_claims (merchant_id, product_id, batch_id, opened_at);
CREATE INDEX code_claims_by_order ON code_claims (merchant_id, order_id);
-- The admins' queue (ListCodeClaims by status) and the refund finisher's (refunding ones).
CREATE INDEX code_claims_unresolved ON code_claims (merchant_id, opened_at, id) WHERE status IN ('open', 'refunding');
CREATE INDEX code_claims_by_customer ON code_claims (customer_id, opened_at);

CREATE TRIGGER code_claims_transition BEFORE UPDATE OF status ON code_claims FOR EACH ROW
    EXECUTE FUNCTION enforce_status_transition('open>replaced', 'open>rejected', 'open>refunding',
                                               'refunding>refunded', 'refunding>open');
CREATE TRIGGER code_claims_no_delete BEFORE DELETE ON code_claims FOR EACH ROW
    EXECUTE FUNCTION refuse_change('claims are history');
SELECT cuty_tenant_table('code_claims');

-- The audit log records every step of a claim and of a batch's quarantine.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_action_check;
-- audit_log may be partitioned already (when the partitioning migration ran first on this
-- database): a partition may then hold its own copy of the old CHECK, which the parent's DROP
-- leaves behind; those go too, and the parent's new CHECK reaches every partition.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.conrelid::regclass AS t FROM pg_constraint c JOIN pg_inherits i ON i.inhrelid = c.conrelid
             WHERE i.inhparent = 'audit_log'::regclass AND c.conname = 'audit_log_action_check' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT audit_log_action_check', r.t);
    END LOOP;
END $$;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_action_check CHECK (action IN (
    'import', 'import_rejected', 'reserve', 'deliver', 'deliver_rejected', 'release', 'expire', 'reveal', 'rotate',
    'read_delivered', 'operator_read', 'claim_open', 'claim_replace', 'claim_reject', 'claim_refund',
    'claim_refunded', 'claim_reopen', 'batch_quarantine', 'batch_release', 'batch_retire', 'claims_export'));

-- The outbox carries the claims' and batches' merchant events too; an event about an order names it,
-- so the orchestrator's relay also writes it into that order's payment timeline.
ALTER TABLE stock_events ADD COLUMN order_id text;
ALTER TABLE stock_events DROP CONSTRAINT stock_events_type_check;
ALTER TABLE stock_events ADD CONSTRAINT stock_events_type_check CHECK (type IN (
    'stock.low', 'code.claimed', 'code.replaced', 'code.claim_rejected', 'code.claim_refunded', 'batch.quarantined'));

-- A batch's quarantined codes, found without walking the product's codes when it is released or
-- retired. Status changes are never HOT updates, and a partial index takes entries only for rows
-- matching it, so the selling path (available <-> reserved -> delivered) never writes to it.
CREATE INDEX codes_quarantined ON codes (merchant_id, product_id, batch_id) WHERE status = 'quarantined';
