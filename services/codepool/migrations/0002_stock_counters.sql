-- Stock per product and state as counters (docs/codepool.md, "Stock counters"): GetStock, the stock
-- gauge and `stock.low` read a product's counter rows instead of counting its codes, which took
-- time in proportion to the codes a product ever had (0.7-1 s at 2 million).
--
-- A product's codes are counted in STOCK_SLOTS rows (codepool_stock_slot: a hash of the code id),
-- summed on read. One row per product would serialise every reservation of a hot product on that
-- row's lock until commit; with the slots, concurrent reservations of one product take different
-- codes and so, mostly, different rows. Each row counts a fixed subset of the codes (a code never
-- changes slot), so every row is a true count and the CHECKs hold per row.
--
-- Kept by the statement that changes the codes: the statement-level triggers codes_stock_after_*
-- (transition tables: a batch of any size is one row update per product and slot, not one per
-- code) call codepool_stock_count. The counters are therefore exact at every commit, under every
-- isolation level, whatever SQL changed the codes (TRUNCATE aside: codes is referenced by
-- deliveries and never truncated).
CREATE TABLE product_stock (
    merchant_id text NOT NULL,
    product_id  uuid NOT NULL,
    slot        smallint NOT NULL CHECK (slot >= 0),
    available   bigint NOT NULL DEFAULT 0 CHECK (available >= 0),
    reserved    bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    delivered   bigint NOT NULL DEFAULT 0 CHECK (delivered >= 0),
    PRIMARY KEY (merchant_id, product_id, slot),
    CONSTRAINT product_stock_product_fkey FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id)
);

-- Small, hot rows: updated in place (HOT, no index column changes), vacuumed early.
ALTER TABLE product_stock SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                               autovacuum_vacuum_cost_delay = 0);

SELECT cuty_tenant_table('product_stock');

-- The existing codes, counted once. Writers wait until this migration commits, so no change
-- slips between the count and the triggers that keep it from now on.
LOCK TABLE codes IN SHARE MODE;
INSERT INTO product_stock (merchant_id, product_id, slot, available, reserved, delivered)
SELECT merchant_id, product_id, codepool_stock_slot(id),
       count(*) FILTER (WHERE status = 'available'),
       count(*) FILTER (WHERE status = 'reserved'),
       count(*) FILTER (WHERE status = 'delivered')
FROM codes
GROUP BY 1, 2, 3;

-- The low-stock decisions read the counters now (codepool_stock_available); a database migrated
-- before has the function this replaced (a fresh one never created it).
DROP FUNCTION IF EXISTS codepool_stock_available_upto(text, uuid, integer);
