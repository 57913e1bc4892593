-- Code pool: digital codes sold exactly once (issue 3, docs/codepool.md).
-- The database is the source of truth: every invariant below is a constraint, an index or a trigger,
-- so hand-written SQL is held to the same rules as the service.

CREATE TABLE products (
    id          uuid PRIMARY KEY,
    sku         text NOT NULL UNIQUE CHECK (length(sku) BETWEEN 1 AND 64),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price_minor bigint NOT NULL CHECK (price_minor >= 0),
    currency    text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per accepted supplier batch. (product_id, batch_ref) is the import's idempotency key;
-- content_digest tells a retried upload of the same file from a different file under the same ref.
CREATE TABLE supplier_batches (
    id             uuid PRIMARY KEY,
    product_id     uuid NOT NULL REFERENCES products,
    batch_ref      text NOT NULL CHECK (length(batch_ref) BETWEEN 1 AND 128),
    received       bigint NOT NULL CHECK (received >= 0),
    imported       bigint NOT NULL CHECK (imported >= 0),
    content_digest bytea NOT NULL CHECK (length(content_digest) = 32),
    actor          text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (product_id, batch_ref)
);

-- A code's value exists only as AES-256-GCM ciphertext (nonce + ciphertext||tag, associated data
-- binding id, product and key id) and as a keyed HMAC-SHA256 used to find duplicates.
CREATE TABLE codes (
    id           uuid PRIMARY KEY,
    -- Import order: the order codes are handed out in (oldest first) and listed in. A column of its
    -- own, not the id, so that only the indexes below can produce this order (see codes_available).
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    product_id   uuid NOT NULL REFERENCES products,
    batch_id     uuid NOT NULL REFERENCES supplier_batches,
    status       text NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'reserved', 'delivered')),
    reserved_at  timestamptz,
    delivered_at timestamptz,
    key_id       text NOT NULL CHECK (length(key_id) BETWEEN 1 AND 32),
    nonce        bytea NOT NULL CHECK (length(nonce) = 12),
    ciphertext   bytea NOT NULL CHECK (length(ciphertext) BETWEEN 17 AND 1040),
    code_hash    bytea NOT NULL CHECK (length(code_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (CASE status
             WHEN 'available' THEN reserved_at IS NULL AND delivered_at IS NULL
             WHEN 'reserved'  THEN reserved_at IS NOT NULL AND delivered_at IS NULL
             ELSE reserved_at IS NOT NULL AND delivered_at IS NOT NULL END),
    -- Duplicates are found by the keyed hash, per product: every constraint is keyed by the tenant
    -- (DESIGN.md "Scale-out") so the table can be distributed by product later.
    UNIQUE (product_id, code_hash)
);

-- The reserve query's index: only available codes, keyed by product, in import order, so
-- `ORDER BY seq LIMIT n FOR UPDATE SKIP LOCKED` finds the next free rows in a few pages.
-- No other index may produce that order: given one (the primary key for `ORDER BY id`, or a full
-- (product_id, seq) index), the planner happily walks it and filters on status, which costs
-- nothing on a fresh table and a scan over every code ever sold later on (the statistics cannot
-- tell that sold codes sit at the low end). `make bench-codepool` prints the plan.
CREATE INDEX codes_available ON codes (product_id, seq) WHERE status = 'available';
-- Staff listing, keyset-paginated by id (time-ordered, so roughly import order).
CREATE INDEX codes_by_product ON codes (product_id, id);

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

-- Codes change status only along available -> reserved -> delivered and reserved -> available;
-- delivered is final. Status changes stamp their own times (from the database clock); a row changes
-- either its status or its encryption (rotation), never both; identity columns never change.
CREATE FUNCTION codes_guard_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id <> OLD.id OR NEW.seq <> OLD.seq OR NEW.product_id <> OLD.product_id OR NEW.batch_id <> OLD.batch_id
       OR NEW.code_hash <> OLD.code_hash OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'code %: identity columns are immutable', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = OLD.status THEN
        IF NEW.reserved_at IS DISTINCT FROM OLD.reserved_at OR NEW.delivered_at IS DISTINCT FROM OLD.delivered_at THEN
            RAISE EXCEPTION 'code %: reserved_at/delivered_at change only with the status', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.key_id <> OLD.key_id OR NEW.nonce <> OLD.nonce OR NEW.ciphertext <> OLD.ciphertext THEN
        RAISE EXCEPTION 'code %: a status change may not re-encrypt the code', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'available' AND NEW.status = 'reserved' THEN
        NEW.reserved_at := clock_timestamp();
        NEW.delivered_at := NULL;
    ELSIF OLD.status = 'reserved' AND NEW.status = 'delivered' THEN
        NEW.reserved_at := OLD.reserved_at;
        NEW.delivered_at := clock_timestamp();
    ELSIF OLD.status = 'reserved' AND NEW.status = 'available' THEN
        NEW.reserved_at := NULL;
        NEW.delivered_at := NULL;
    ELSE
        RAISE EXCEPTION 'code %: status % -> % is not allowed', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER codes_guard_update BEFORE UPDATE ON codes FOR EACH ROW EXECUTE FUNCTION codes_guard_update();

CREATE FUNCTION codes_guard_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status <> 'available' THEN
        RAISE EXCEPTION 'code %: a % code cannot be deleted', OLD.id, OLD.status USING ERRCODE = 'check_violation';
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER codes_guard_delete BEFORE DELETE ON codes FOR EACH ROW EXECUTE FUNCTION codes_guard_delete();

-- Status transitions of the other tables, given as 'from>to' trigger arguments.
CREATE FUNCTION enforce_status_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT ((OLD.status || '>' || NEW.status) = ANY (TG_ARGV)) THEN
        RAISE EXCEPTION '%: status % -> % is not allowed', TG_TABLE_NAME, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%: % is not allowed (%)', TG_TABLE_NAME, TG_OP, TG_ARGV[0] USING ERRCODE = 'insufficient_privilege';
END $$;

-- One row per order (the checkout's order; one item per order). order_item_id is ReserveCodes'
-- idempotency key. A released reservation can be taken up again only by DeliverCodes (the payment
-- arrived after expiry); delivered is final.
CREATE TABLE reservations (
    order_id               text PRIMARY KEY CHECK (length(order_id) BETWEEN 1 AND 128),
    order_item_id          text NOT NULL UNIQUE CHECK (length(order_item_id) BETWEEN 1 AND 128),
    product_id             uuid NOT NULL REFERENCES products,
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
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL AND payment_transaction_id IS NOT NULL)),
    CHECK ((status = 'released') = (released_at IS NOT NULL AND release_reason IS NOT NULL))
);

-- ReserveCodes is one autocommit statement (repository.RESERVE); when it could take fewer codes
-- than ordered it calls this, so the statement and everything it inserted is undone: all or nothing
-- without a BEGIN/COMMIT round trip on the hot path.
CREATE FUNCTION codepool_short_stock(requested int, taken bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'out of stock: % codes requested, % could be taken', requested, taken
        USING ERRCODE = 'CP001';
END $$;

-- The sweeper's queue: only live reservations, by expiry.
CREATE INDEX reservations_expiry ON reservations (expires_at) WHERE status = 'reserved';
ALTER TABLE reservations SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);

CREATE TRIGGER reservations_transition BEFORE UPDATE OF status ON reservations FOR EACH ROW
    EXECUTE FUNCTION enforce_status_transition('reserved>delivered', 'reserved>released', 'released>reserved');
CREATE TRIGGER reservations_no_delete BEFORE DELETE ON reservations FOR EACH ROW
    EXECUTE FUNCTION refuse_change('reservations are history');

-- Which order got which code: one row per (order, code) attempt.
CREATE TABLE deliveries (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id      text NOT NULL REFERENCES reservations,
    order_item_id text NOT NULL,
    product_id    uuid NOT NULL,
    customer_id   text NOT NULL,
    code_id       uuid NOT NULL REFERENCES codes,
    status        text NOT NULL CHECK (status IN ('reserved', 'delivered', 'released')),
    reserved_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    delivered_at  timestamptz,
    released_at   timestamptz
);

-- Invariant 3 of DESIGN.md: a code is in at most one active (reserved or delivered) delivery.
CREATE UNIQUE INDEX deliveries_one_active_per_code ON deliveries (code_id) WHERE status IN ('reserved', 'delivered');
CREATE INDEX deliveries_by_order ON deliveries (order_id);
ALTER TABLE deliveries SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);

CREATE TRIGGER deliveries_transition BEFORE UPDATE OF status ON deliveries FOR EACH ROW
    EXECUTE FUNCTION enforce_status_transition('reserved>delivered', 'reserved>released');
CREATE TRIGGER deliveries_no_delete BEFORE DELETE ON deliveries FOR EACH ROW
    EXECUTE FUNCTION refuse_change('deliveries are history');

-- The truth about payment callbacks: a transaction id is acted on once. The row is written and
-- given its outcome in the same transaction as the delivery (or the refusal), so a repeated or
-- concurrent callback finds the first one's answer.
CREATE TABLE payment_transactions (
    transaction_id text PRIMARY KEY CHECK (length(transaction_id) BETWEEN 1 AND 256),
    order_id       text NOT NULL REFERENCES reservations,
    outcome        text NOT NULL CHECK (outcome IN ('delivered', 'rejected')),
    reason         text,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((outcome = 'rejected') = (reason IS NOT NULL))
);

CREATE TRIGGER payment_transactions_no_delete BEFORE DELETE ON payment_transactions FOR EACH ROW
    EXECUTE FUNCTION refuse_change('payment transactions are history');

-- How often each code was revealed to an admin; kept out of `codes` so a reveal does not create a
-- new version of a hot row.
CREATE TABLE code_views (
    code_id        uuid PRIMARY KEY REFERENCES codes,
    views          bigint NOT NULL CHECK (views > 0),
    last_viewed_at timestamptz NOT NULL
);

-- Who did what to which order and code, and when; never a code value. Append-only.
CREATE TABLE audit_log (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor      text NOT NULL,
    action     text NOT NULL CHECK (action IN ('import', 'import_rejected', 'reserve', 'deliver', 'deliver_rejected',
                                              'release', 'expire', 'reveal', 'rotate')),
    product_id uuid,
    order_id   text,
    code_ids   uuid[],
    details    jsonb NOT NULL DEFAULT '{}'
);

CREATE INDEX audit_log_by_order ON audit_log (order_id) WHERE order_id IS NOT NULL;

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
