-- Code pool: digital codes sold exactly once (docs/codepool.md).
-- The database is the source of truth: every invariant below is a constraint, an index or a trigger,
-- so hand-written SQL is held to the same rules as the service. The trigger functions live one per
-- file in functions/.
--
-- Merchants as tenants (docs/tenancy.md, "The code pool"): a merchant owns its products and
-- everything made from them: supplier batches, codes, reservations, deliveries, payment
-- transactions, reveal counters, the audit log of its codes and its stock events. Every insert names
-- its merchant (no default), taken in SQL from the parent row, and every child references its parent
-- by (merchant_id, ...), so a row is always in its parent's merchant. Global: hash_key_check (one
-- hash key for the service). Customers are global (a customer buys from any merchant): the
-- per-customer caps count across merchants (reservations_customer_live is keyed by customer).

-- `stock.low` (docs/codepool.md "Low stock"): a product's stock is low when its available codes are
-- at or below its low_stock_threshold. The event is written on the crossing only: stock_low is the
-- product's "announced" flag. A drop to or below the threshold sets it and writes the event (once); a
-- rise above it (an import, a release, an expiry) clears it, which re-arms the event. A new product
-- has no stock, so it starts low (no event until it has been stocked above its threshold once).
CREATE TABLE products (
    id                  uuid PRIMARY KEY,
    sku                 text NOT NULL CHECK (length(sku) BETWEEN 1 AND 64),
    name                text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price_minor         bigint NOT NULL CHECK (price_minor >= 0),
    currency            text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id         text NOT NULL CHECK (length(merchant_id) BETWEEN 1 AND 200),
    low_stock_threshold integer NOT NULL DEFAULT 10
        CONSTRAINT products_low_stock_threshold_range CHECK (low_stock_threshold BETWEEN 0 AND 1000000),
    stock_low           boolean NOT NULL DEFAULT true,
    -- a sku is unique within its merchant (two merchants may sell the same sku)
    CONSTRAINT products_merchant_sku_key UNIQUE (merchant_id, sku),
    CONSTRAINT products_merchant_id_key UNIQUE (merchant_id, id)
);

-- One row per accepted supplier batch. (merchant_id, product_id, batch_ref) is the import's
-- idempotency key; content_digest tells a retried upload of the same file from a different file under
-- the same ref. Codes reference (merchant, product, batch), so a code is always in a batch of its own
-- product and merchant.
CREATE TABLE supplier_batches (
    id             uuid PRIMARY KEY,
    product_id     uuid NOT NULL,
    batch_ref      text NOT NULL CHECK (length(batch_ref) BETWEEN 1 AND 128),
    received       bigint NOT NULL CHECK (received >= 0),
    imported       bigint NOT NULL CHECK (imported >= 0),
    content_digest bytea NOT NULL CHECK (length(content_digest) = 32),
    actor          text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id    text NOT NULL,
    CONSTRAINT supplier_batches_product_fkey FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id),
    CONSTRAINT supplier_batches_merchant_product_batch_ref_key UNIQUE (merchant_id, product_id, batch_ref),
    CONSTRAINT supplier_batches_merchant_product_id_key UNIQUE (merchant_id, product_id, id)
);

-- A code's value exists only as AES-256-GCM ciphertext (nonce + ciphertext||tag, associated data
-- binding id, product and key id) and as a keyed HMAC-SHA256 used to find duplicates.
-- Few indexes on purpose: every status change updates them all (docs/codepool.md). The primary key
-- on the random uuid; UNIQUE (merchant_id, product_id, id), which deliveries and code_views
-- reference, is also the staff listing's index (keyset-paginated by id, time-ordered, so roughly
-- import order).
CREATE TABLE codes (
    id           uuid PRIMARY KEY,
    -- Import order: the order codes are handed out in (oldest first) and listed in. A column of its
    -- own, not the id, so that only the indexes below can produce this order (see codes_available).
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    product_id   uuid NOT NULL,
    batch_id     uuid NOT NULL,
    status       text NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'reserved', 'delivered')),
    reserved_at  timestamptz,
    delivered_at timestamptz,
    key_id       text NOT NULL CHECK (length(key_id) BETWEEN 1 AND 32),
    nonce        bytea NOT NULL CHECK (length(nonce) = 12),
    ciphertext   bytea NOT NULL CHECK (length(ciphertext) BETWEEN 17 AND 1040),
    code_hash    bytea NOT NULL CHECK (length(code_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id  text NOT NULL,
    CHECK (CASE status
             WHEN 'available' THEN reserved_at IS NULL AND delivered_at IS NULL
             WHEN 'reserved'  THEN reserved_at IS NOT NULL AND delivered_at IS NULL
             ELSE reserved_at IS NOT NULL AND delivered_at IS NOT NULL END),
    CONSTRAINT codes_product_fkey FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id),
    CONSTRAINT codes_batch_fkey
        FOREIGN KEY (merchant_id, product_id, batch_id) REFERENCES supplier_batches (merchant_id, product_id, id),
    -- Duplicates are found by the keyed hash, per product: every constraint is keyed by the tenant
    -- (docs/tenancy.md, "Keys ready for distribution") so the table can be distributed by merchant and product later.
    CONSTRAINT codes_merchant_product_code_hash_key UNIQUE (merchant_id, product_id, code_hash),
    CONSTRAINT codes_merchant_product_id_key UNIQUE (merchant_id, product_id, id)
);

-- The reserve query's index: only available codes, keyed by merchant and product, in import order,
-- so `ORDER BY seq LIMIT n FOR UPDATE SKIP LOCKED` finds the next free rows in a few pages.
-- No other index may produce that order: given one (the primary key for `ORDER BY id`, or a full
-- (merchant_id, product_id, seq) index), the planner happily walks it and filters on status, which
-- costs nothing on a fresh table and a scan over every code ever sold later on (the statistics
-- cannot tell that sold codes sit at the low end). `make bench-codepool` prints the plan.
CREATE INDEX codes_available ON codes (merchant_id, product_id, seq) WHERE status = 'available';

-- Every reservation turns an available row into a dead tuple plus a dead entry at the low end of
-- codes_available; SKIP LOCKED scans walk over those until vacuum removes them. Vacuum after a fixed
-- number of changes (not a fraction of a table that may hold millions), without throttling.
ALTER TABLE codes SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

CREATE TRIGGER codes_guard_update BEFORE UPDATE ON codes FOR EACH ROW EXECUTE FUNCTION codes_guard_update();
CREATE TRIGGER codes_guard_delete BEFORE DELETE ON codes FOR EACH ROW EXECUTE FUNCTION codes_guard_delete();

-- One row per order (the checkout's order; one item per order). The primary key is the
-- orchestrator's order id (its checkout's random uuid), the key every system RPC (DeliverCodes,
-- ReleaseReservation, GetReservation) looks it up by without knowing the merchant. ReserveCodes'
-- idempotency key (order_item_id) is unique within the merchant. A released reservation can be taken
-- up again only by DeliverCodes (the payment arrived after expiry); delivered is final.
CREATE TABLE reservations (
    order_id               text PRIMARY KEY CHECK (length(order_id) BETWEEN 1 AND 128),
    order_item_id          text NOT NULL CHECK (length(order_item_id) BETWEEN 1 AND 128),
    product_id             uuid NOT NULL,
    customer_id            text NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 128),
    quantity               int NOT NULL CHECK (quantity BETWEEN 1 AND 100),
    unit_price_minor       bigint NOT NULL,
    currency               text NOT NULL,
    status                 text NOT NULL CHECK (status IN ('reserved', 'delivered', 'released')),
    reserved_at            timestamptz NOT NULL,
    expires_at             timestamptz NOT NULL,
    delivered_at           timestamptz,
    released_at            timestamptz,
    release_reason         text CHECK (release_reason IN ('released', 'expired')),
    payment_transaction_id text,
    merchant_id            text NOT NULL,
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL AND payment_transaction_id IS NOT NULL)),
    CHECK ((status = 'released') = (released_at IS NOT NULL AND release_reason IS NOT NULL)),
    CONSTRAINT reservations_product_fkey FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id),
    CONSTRAINT reservations_merchant_order_item_key UNIQUE (merchant_id, order_item_id),
    CONSTRAINT reservations_merchant_order_key UNIQUE (merchant_id, order_id)
);

-- The sweeper's queue: only live reservations, by expiry. It is small, so the sweeper's scan over
-- every merchant reads all of it; a distributed shard's sweeper reads its merchants'.
CREATE INDEX reservations_expiry ON reservations (merchant_id, expires_at) WHERE status = 'reserved';
-- The per-customer caps' count (codepool_customer_cap) reads only the customer's live reservations.
CREATE INDEX reservations_customer_live ON reservations (customer_id) WHERE status = 'reserved';
ALTER TABLE reservations SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);

CREATE TRIGGER reservations_transition BEFORE UPDATE OF status ON reservations FOR EACH ROW
    EXECUTE FUNCTION enforce_status_transition('reserved>delivered', 'reserved>released', 'released>reserved');
CREATE TRIGGER reservations_no_delete BEFORE DELETE ON reservations FOR EACH ROW
    EXECUTE FUNCTION refuse_change('reservations are history');

-- Which order got which code: one row per (order, code) attempt.
CREATE TABLE deliveries (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id      text NOT NULL,
    order_item_id text NOT NULL,
    product_id    uuid NOT NULL,
    customer_id   text NOT NULL,
    code_id       uuid NOT NULL,
    status        text NOT NULL CHECK (status IN ('reserved', 'delivered', 'released')),
    reserved_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    delivered_at  timestamptz,
    released_at   timestamptz,
    merchant_id   text NOT NULL,
    CONSTRAINT deliveries_order_fkey FOREIGN KEY (merchant_id, order_id) REFERENCES reservations (merchant_id, order_id),
    CONSTRAINT deliveries_code_fkey
        FOREIGN KEY (merchant_id, product_id, code_id) REFERENCES codes (merchant_id, product_id, id)
);

-- Invariant 3 of docs/architecture.md: a code is in at most one active (reserved or delivered) delivery
-- (within the code's merchant: a code has one merchant).
CREATE UNIQUE INDEX deliveries_one_active_per_code ON deliveries (merchant_id, code_id)
    WHERE status IN ('reserved', 'delivered');
CREATE INDEX deliveries_by_order ON deliveries (merchant_id, order_id);
ALTER TABLE deliveries SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);

CREATE TRIGGER deliveries_transition BEFORE UPDATE OF status ON deliveries FOR EACH ROW
    EXECUTE FUNCTION enforce_status_transition('reserved>delivered', 'reserved>released');
CREATE TRIGGER deliveries_no_delete BEFORE DELETE ON deliveries FOR EACH ROW
    EXECUTE FUNCTION refuse_change('deliveries are history');

-- The truth about payment callbacks: a transaction id is acted on once (within the merchant of its
-- order). The row is written and given its outcome in the same transaction as the delivery (or the
-- refusal), so a repeated or concurrent callback finds the first one's answer.
CREATE TABLE payment_transactions (
    transaction_id text NOT NULL CHECK (length(transaction_id) BETWEEN 1 AND 256),
    order_id       text NOT NULL,
    outcome        text NOT NULL CHECK (outcome IN ('delivered', 'rejected')),
    reason         text,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id    text NOT NULL,
    CHECK ((outcome = 'rejected') = (reason IS NOT NULL)),
    PRIMARY KEY (merchant_id, transaction_id),
    CONSTRAINT payment_transactions_order_fkey
        FOREIGN KEY (merchant_id, order_id) REFERENCES reservations (merchant_id, order_id)
);

CREATE TRIGGER payment_transactions_no_delete BEFORE DELETE ON payment_transactions FOR EACH ROW
    EXECUTE FUNCTION refuse_change('payment transactions are history');

-- How often each code was revealed to an admin, one counter per code; kept out of `codes` so a
-- reveal does not create a new version of a hot row.
CREATE TABLE code_views (
    code_id        uuid NOT NULL,
    views          bigint NOT NULL CHECK (views > 0),
    last_viewed_at timestamptz NOT NULL,
    merchant_id    text NOT NULL,
    product_id     uuid NOT NULL,
    PRIMARY KEY (merchant_id, code_id),
    CONSTRAINT code_views_code_fkey
        FOREIGN KEY (merchant_id, product_id, code_id) REFERENCES codes (merchant_id, product_id, id)
);

-- Who did what to which order and code, and when; never a code value. Append-only. Every plaintext
-- read of a code is audited: an admin's RevealCode ('reveal') and the buyer's GetDeliveredCodes
-- ('read_delivered': the order, its codes, who asked). No foreign key: an entry outlives nothing it
-- names, and a rotation's entry names codes only. Operator reads across merchants (GetStock,
-- ListCodes) are recorded in the merchant whose data was read ('operator_read'), with the
-- operator's subject and role.
CREATE TABLE audit_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor       text NOT NULL,
    action      text NOT NULL CONSTRAINT audit_log_action_check CHECK (action IN (
        'import', 'import_rejected', 'reserve', 'deliver', 'deliver_rejected', 'release', 'expire', 'reveal', 'rotate',
        'read_delivered', 'operator_read')),
    product_id  uuid,
    order_id    text,
    code_ids    uuid[],
    details     jsonb NOT NULL DEFAULT '{}',
    merchant_id text NOT NULL
);

CREATE INDEX audit_log_by_order ON audit_log (merchant_id, order_id) WHERE order_id IS NOT NULL;

CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log FOR EACH ROW
    EXECUTE FUNCTION refuse_change('the audit log is append-only');
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log FOR EACH STATEMENT
    EXECUTE FUNCTION refuse_change('the audit log is append-only');

-- A fingerprint of the hash key the codes were hashed under: a service started with another hash
-- key would silently stop finding duplicates, so it refuses to start instead.
CREATE TABLE hash_key_check (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    fingerprint bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The `stock.low` outbox (docs/codepool.md "Low stock", docs/webhooks-out.md). The code pool owns
-- stock, so it owns the event: written by the statement that changes a product's available stock
-- (codes_stock_after_* -> codepool_stock_changed -> codepool_check_stock), read by the orchestrator
-- through ListStockEvents and relayed into its merchant events.
-- `seq` is the feed's cursor (ListStockEvents(after_seq)): an event is inserted only while its
-- transaction holds the advisory lock 'codepool.stock_events' (codepool_check_stock), taken before
-- the identity's nextval and held until commit, so events become visible in seq order and a reader
-- that has seen seq n never later finds a committed event below n. Events are rare (one per
-- crossing), so that lock costs nothing the hot path notices.
CREATE TABLE stock_events (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    merchant_id text NOT NULL,
    id          uuid NOT NULL,
    product_id  uuid NOT NULL,
    type        text NOT NULL CHECK (type IN ('stock.low')),
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (merchant_id, id),
    FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id)
);
CREATE INDEX stock_events_product ON stock_events (merchant_id, product_id, seq);

CREATE TRIGGER stock_events_append_only BEFORE UPDATE OR DELETE ON stock_events FOR EACH ROW
    EXECUTE FUNCTION refuse_change('stock events are history');

-- A product's available stock changes: re-decide its low-stock flag in the same statement.
CREATE TRIGGER codes_stock_after_insert AFTER INSERT ON codes REFERENCING NEW TABLE AS new_codes
    FOR EACH STATEMENT EXECUTE FUNCTION codes_stock_after_insert();
CREATE TRIGGER codes_stock_after_update AFTER UPDATE ON codes REFERENCING OLD TABLE AS old_codes NEW TABLE AS new_codes
    FOR EACH STATEMENT EXECUTE FUNCTION codes_stock_after_update();
CREATE TRIGGER codes_stock_after_delete AFTER DELETE ON codes REFERENCING OLD TABLE AS old_codes
    FOR EACH STATEMENT EXECUTE FUNCTION codes_stock_after_delete();

-- Row-Level Security and the immutable merchant (libs/cutylib/migrations/functions/cuty_tenant_table.sql).
SELECT cuty_tenant_table('products');
SELECT cuty_tenant_table('supplier_batches');
SELECT cuty_tenant_table('codes');
SELECT cuty_tenant_table('reservations');
SELECT cuty_tenant_table('deliveries');
SELECT cuty_tenant_table('payment_transactions');
SELECT cuty_tenant_table('code_views');
SELECT cuty_tenant_table('audit_log');
SELECT cuty_tenant_table('stock_events');
