-- Issue 14: merchants as tenants (docs/tenancy-codepool.md). A merchant owns its products and
-- everything made from them: supplier batches, codes, reservations, deliveries, payment
-- transactions, reveal counters and the audit log of its codes. Global: hash_key_check (one
-- hash key for the service). Customers are global (a customer buys from any merchant): the
-- per-customer caps count across merchants (reservations_customer_live stays keyed by customer).
--
-- Every row that exists before this migration belongs to a product, and every product moves into
-- the merchant 'default' (cutylib.tenancy.DEFAULT_MERCHANT), so every child's parent is 'default'
-- too: the backfill is the column's default, which PostgreSQL applies without rewriting the tables
-- (and without firing codes' and audit_log's update triggers). The default is dropped right after,
-- so every later insert names its merchant, taken in SQL from the parent row.

ALTER TABLE products             ADD COLUMN merchant_id text NOT NULL DEFAULT 'default';
ALTER TABLE supplier_batches     ADD COLUMN merchant_id text NOT NULL DEFAULT 'default';
ALTER TABLE codes                ADD COLUMN merchant_id text NOT NULL DEFAULT 'default';
ALTER TABLE reservations         ADD COLUMN merchant_id text NOT NULL DEFAULT 'default';
ALTER TABLE deliveries           ADD COLUMN merchant_id text NOT NULL DEFAULT 'default';
ALTER TABLE payment_transactions ADD COLUMN merchant_id text NOT NULL DEFAULT 'default';
ALTER TABLE code_views           ADD COLUMN merchant_id text NOT NULL DEFAULT 'default';
ALTER TABLE audit_log            ADD COLUMN merchant_id text NOT NULL DEFAULT 'default';
-- code_views learns its code's product, for the composite foreign key below.
ALTER TABLE code_views           ADD COLUMN product_id uuid;
UPDATE code_views v SET product_id = c.product_id FROM codes c WHERE c.id = v.code_id;
ALTER TABLE code_views           ALTER COLUMN product_id SET NOT NULL;

ALTER TABLE products             ALTER COLUMN merchant_id DROP DEFAULT;
ALTER TABLE supplier_batches     ALTER COLUMN merchant_id DROP DEFAULT;
ALTER TABLE codes                ALTER COLUMN merchant_id DROP DEFAULT;
ALTER TABLE reservations         ALTER COLUMN merchant_id DROP DEFAULT;
ALTER TABLE deliveries           ALTER COLUMN merchant_id DROP DEFAULT;
ALTER TABLE payment_transactions ALTER COLUMN merchant_id DROP DEFAULT;
ALTER TABLE code_views           ALTER COLUMN merchant_id DROP DEFAULT;
ALTER TABLE audit_log            ALTER COLUMN merchant_id DROP DEFAULT;

ALTER TABLE products ADD CONSTRAINT products_merchant_id_check CHECK (length(merchant_id) BETWEEN 1 AND 200);

-- products: a sku is unique within its merchant (two merchants may sell the same sku).
ALTER TABLE products DROP CONSTRAINT products_sku_key;
ALTER TABLE products ADD CONSTRAINT products_merchant_sku_key UNIQUE (merchant_id, sku);
ALTER TABLE products ADD CONSTRAINT products_merchant_id_key UNIQUE (merchant_id, id);

-- supplier_batches: the import's idempotency key within the merchant; children reference
-- (merchant, product, batch), so a code is always in a batch of its own product and merchant.
ALTER TABLE supplier_batches DROP CONSTRAINT supplier_batches_product_id_fkey;
ALTER TABLE supplier_batches ADD CONSTRAINT supplier_batches_product_fkey
    FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id);
ALTER TABLE supplier_batches DROP CONSTRAINT supplier_batches_product_id_batch_ref_key;
ALTER TABLE supplier_batches ADD CONSTRAINT supplier_batches_merchant_product_batch_ref_key
    UNIQUE (merchant_id, product_id, batch_ref);
ALTER TABLE supplier_batches ADD CONSTRAINT supplier_batches_merchant_product_id_key
    UNIQUE (merchant_id, product_id, id);

-- codes: few indexes on purpose (every status change updates them all, docs/codepool.md). The
-- staff listing's (product_id, id) index becomes the UNIQUE (merchant_id, product_id, id) that
-- deliveries and code_views reference: no index is added. The primary key on the random uuid stays.
ALTER TABLE codes DROP CONSTRAINT codes_product_id_fkey;
ALTER TABLE codes DROP CONSTRAINT codes_batch_id_fkey;
ALTER TABLE codes ADD CONSTRAINT codes_product_fkey
    FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id);
ALTER TABLE codes ADD CONSTRAINT codes_batch_fkey
    FOREIGN KEY (merchant_id, product_id, batch_id) REFERENCES supplier_batches (merchant_id, product_id, id);
ALTER TABLE codes DROP CONSTRAINT codes_product_id_code_hash_key;
ALTER TABLE codes ADD CONSTRAINT codes_merchant_product_code_hash_key UNIQUE (merchant_id, product_id, code_hash);
DROP INDEX codes_by_product;
ALTER TABLE codes ADD CONSTRAINT codes_merchant_product_id_key UNIQUE (merchant_id, product_id, id);
DROP INDEX codes_available;
CREATE INDEX codes_available ON codes (merchant_id, product_id, seq) WHERE status = 'available';

-- merchant_id is an identity column of a code as well (the tenancy trigger refuses its change too).
CREATE OR REPLACE FUNCTION codes_guard_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id <> OLD.id OR NEW.seq <> OLD.seq OR NEW.product_id <> OLD.product_id OR NEW.batch_id <> OLD.batch_id
       OR NEW.code_hash <> OLD.code_hash OR NEW.created_at <> OLD.created_at OR NEW.merchant_id <> OLD.merchant_id THEN
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

-- reservations: the primary key stays the orchestrator's order id (its checkout's random uuid),
-- the key every system RPC (DeliverCodes, ReleaseReservation, GetReservation) looks it up by without
-- knowing the merchant. ReserveCodes' idempotency key (order_item_id) is unique within the merchant.
ALTER TABLE reservations DROP CONSTRAINT reservations_product_id_fkey;
ALTER TABLE reservations ADD CONSTRAINT reservations_product_fkey
    FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id);
ALTER TABLE reservations DROP CONSTRAINT reservations_order_item_id_key;
ALTER TABLE reservations ADD CONSTRAINT reservations_merchant_order_item_key UNIQUE (merchant_id, order_item_id);
ALTER TABLE reservations ADD CONSTRAINT reservations_merchant_order_key UNIQUE (merchant_id, order_id);
-- The sweeper's queue: it is small (live reservations only), so the sweeper's scan over every
-- merchant reads all of it; a distributed shard's sweeper reads its merchants'.
DROP INDEX reservations_expiry;
CREATE INDEX reservations_expiry ON reservations (merchant_id, expires_at) WHERE status = 'reserved';

-- deliveries: one active delivery per code, within the code's merchant (a code has one merchant).
ALTER TABLE deliveries DROP CONSTRAINT deliveries_order_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_code_id_fkey;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_order_fkey
    FOREIGN KEY (merchant_id, order_id) REFERENCES reservations (merchant_id, order_id);
ALTER TABLE deliveries ADD CONSTRAINT deliveries_code_fkey
    FOREIGN KEY (merchant_id, product_id, code_id) REFERENCES codes (merchant_id, product_id, id);
DROP INDEX deliveries_one_active_per_code;
CREATE UNIQUE INDEX deliveries_one_active_per_code ON deliveries (merchant_id, code_id)
    WHERE status IN ('reserved', 'delivered');
DROP INDEX deliveries_by_order;
CREATE INDEX deliveries_by_order ON deliveries (merchant_id, order_id);

-- payment_transactions: a transaction id is acted on once within the merchant of its order.
ALTER TABLE payment_transactions DROP CONSTRAINT payment_transactions_order_id_fkey;
ALTER TABLE payment_transactions ADD CONSTRAINT payment_transactions_order_fkey
    FOREIGN KEY (merchant_id, order_id) REFERENCES reservations (merchant_id, order_id);
ALTER TABLE payment_transactions DROP CONSTRAINT payment_transactions_pkey;
ALTER TABLE payment_transactions ADD PRIMARY KEY (merchant_id, transaction_id);

-- code_views: one counter per code, within its merchant.
ALTER TABLE code_views DROP CONSTRAINT code_views_code_id_fkey;
ALTER TABLE code_views ADD CONSTRAINT code_views_code_fkey
    FOREIGN KEY (merchant_id, product_id, code_id) REFERENCES codes (merchant_id, product_id, id);
ALTER TABLE code_views DROP CONSTRAINT code_views_pkey;
ALTER TABLE code_views ADD PRIMARY KEY (merchant_id, code_id);

-- audit_log: the merchant's history (no foreign key, as before: an entry outlives nothing it names,
-- and a rotation's entry names codes only). Operator reads across merchants (GetStock, ListCodes)
-- are recorded in the merchant whose data was read, with the operator's subject and role.
DROP INDEX audit_log_by_order;
CREATE INDEX audit_log_by_order ON audit_log (merchant_id, order_id) WHERE order_id IS NOT NULL;
ALTER TABLE audit_log DROP CONSTRAINT audit_log_action_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_action_check CHECK (action IN (
    'import', 'import_rejected', 'reserve', 'deliver', 'deliver_rejected', 'release', 'expire', 'reveal', 'rotate',
    'read_delivered', 'operator_read'));

-- The per-customer caps (0002) find an existing order item within the product's merchant, where
-- its unique index is; the caps themselves stay per customer, across merchants.
DROP FUNCTION codepool_customer_cap(text, uuid, text, text, integer, integer, integer);
CREATE FUNCTION codepool_customer_cap(p_customer_id text, p_product_id uuid, p_order_id text, p_order_item_id text,
                                      p_quantity integer, p_max_active integer, p_max_quantity integer,
                                      p_merchant_id text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_active integer;
    v_quantity bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('codepool.customer:' || p_customer_id, 0));
    IF EXISTS (SELECT FROM reservations r
               WHERE r.order_id = p_order_id OR (r.merchant_id = p_merchant_id AND r.order_item_id = p_order_item_id)) THEN
        RETURN true;
    END IF;
    SELECT count(*), coalesce(sum(r.quantity) FILTER (WHERE r.product_id = p_product_id), 0)
      INTO v_active, v_quantity
      FROM reservations r
     WHERE r.customer_id = p_customer_id AND r.status = 'reserved' AND r.expires_at > clock_timestamp();
    IF v_active >= p_max_active THEN
        RAISE EXCEPTION 'customer has % live reservations, % allowed', v_active, p_max_active
            USING ERRCODE = 'CP002', DETAIL = v_active::text;
    END IF;
    IF v_quantity + p_quantity > p_max_quantity THEN
        RAISE EXCEPTION 'customer has % codes of the product reserved, % more requested, % allowed',
                        v_quantity, p_quantity, p_max_quantity
            USING ERRCODE = 'CP003', DETAIL = v_quantity::text;
    END IF;
    RETURN true;
END $$;

-- Row-Level Security and the immutable merchant, after the backfill (cutylib's 0000 migration).
SELECT cuty_tenant_table('products');
SELECT cuty_tenant_table('supplier_batches');
SELECT cuty_tenant_table('codes');
SELECT cuty_tenant_table('reservations');
SELECT cuty_tenant_table('deliveries');
SELECT cuty_tenant_table('payment_transactions');
SELECT cuty_tenant_table('code_views');
SELECT cuty_tenant_table('audit_log');
