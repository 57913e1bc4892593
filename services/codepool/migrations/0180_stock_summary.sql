-- What changed since the last stock round, and each product's stock in one row (docs/codepool.md,
-- "Stock rounds"). The stock gauge and the `stock.low` repair read what changed, not the catalogue:
-- before, each was one pass over every product's counter rows (16 per product; 75-119 ms over
-- 1,002 products under load, growing with the catalogue).
--
-- product_stock.dirty: set by the statement that changes a counter row (codepool_stock_count; the
-- row it updates anyway, so the hot path writes nothing more), cleared by the stock round
-- (codepool_stock_round) once it has summed the product and re-decided its low-stock flag. A row
-- is cleared only if no change came after the round read it (its version is the one read, and no
-- one holds it: SKIP LOCKED), so a change is never cleared unseen. Every existing row starts dirty:
-- the first rounds sum the catalogue once, in bounded batches.
ALTER TABLE product_stock ADD COLUMN dirty boolean NOT NULL DEFAULT true;
-- Small: the rows changed since the last round. Set again on a row already dirty changes no
-- indexed value, so a hot product's counter updates stay HOT between rounds.
CREATE INDEX product_stock_dirty ON product_stock (product_id) WHERE dirty;

-- A product's stock summed over its counter rows, as of the last round that saw it change: one
-- row per product (every product has one from its creation, products_stock_summary), written only
-- by the stock round. The gauge reads the products nearest to running out from its index.
CREATE TABLE stock_summary (
    merchant_id text NOT NULL,
    product_id  uuid NOT NULL,
    available   bigint NOT NULL DEFAULT 0,
    reserved    bigint NOT NULL DEFAULT 0,
    delivered   bigint NOT NULL DEFAULT 0,
    quarantined bigint NOT NULL DEFAULT 0,
    revoked     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (merchant_id, product_id),
    CONSTRAINT stock_summary_product_fkey FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id)
);
-- The gauge's order (codepool/metrics.py): never stocked last, then fewest available first.
CREATE INDEX stock_summary_nearest ON stock_summary (((available + reserved + delivered) = 0), available, product_id);
SELECT cuty_tenant_table('stock_summary');

INSERT INTO stock_summary (merchant_id, product_id) SELECT merchant_id, id FROM products;
CREATE TRIGGER products_stock_summary AFTER INSERT ON products REFERENCING NEW TABLE AS new_products
    FOR EACH STATEMENT EXECUTE FUNCTION products_stock_summary();

-- The whole code pool's stock (every merchant's): the sum of stock_summary, kept by the stock round
-- with the differences it writes there, so the gauge's "other" series is one row, not a sum over
-- the catalogue. The system's figure, no merchant's data: no merchant_id, no RLS (like
-- metrics_leases); only the gauge reads it.
CREATE TABLE stock_totals (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    available   bigint NOT NULL DEFAULT 0,
    reserved    bigint NOT NULL DEFAULT 0,
    delivered   bigint NOT NULL DEFAULT 0,
    quarantined bigint NOT NULL DEFAULT 0,
    revoked     bigint NOT NULL DEFAULT 0
);
INSERT INTO stock_totals DEFAULT VALUES;

-- The round replaces the catalogue-wide recheck.
DROP FUNCTION IF EXISTS codepool_stock_recheck();
