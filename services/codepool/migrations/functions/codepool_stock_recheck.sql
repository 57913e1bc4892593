-- Every product whose low-stock flag disagrees with its committed stock (what a race on
-- codepool_stock_changed's fast path leaves behind), re-decided on the decision path, in product id
-- order as statements lock them. Returns how many were re-decided. The code pool runs it every
-- CUTY_STOCK_LOW_RECHECK_SECONDS (codepool/stock_events.py). So a `stock.low` is never lost: it is
-- written by the statement that crosses the threshold, or, in that race, by the recheck shortly
-- after; and never twice for one crossing (the flag, decided under the lock, says it was announced).
CREATE OR REPLACE FUNCTION codepool_stock_recheck() RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p record;
    n integer := 0;
BEGIN
    -- One pass over the counters for every product (not one lookup per product: 200 ms at 1,000
    -- products under load, `make bench-growth`); the same sum as codepool_stock_available.
    FOR p IN SELECT pr.merchant_id, pr.id FROM products pr
             LEFT JOIN (SELECT s.merchant_id, s.product_id, sum(s.available) AS available FROM product_stock s
                        GROUP BY s.merchant_id, s.product_id) st
                    ON st.merchant_id = pr.merchant_id AND st.product_id = pr.id
             WHERE pr.stock_low <> (coalesce(st.available, 0) <= pr.low_stock_threshold)
             ORDER BY pr.id LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.id::text, 0));
        PERFORM codepool_check_stock(p.merchant_id, p.id);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
