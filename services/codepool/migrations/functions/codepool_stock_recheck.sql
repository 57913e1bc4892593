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
    FOR p IN SELECT pr.merchant_id, pr.id FROM products pr
             WHERE pr.stock_low <> (codepool_stock_available(pr.merchant_id, pr.id) <= pr.low_stock_threshold)
             ORDER BY pr.id LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.id::text, 0));
        PERFORM codepool_check_stock(p.merchant_id, p.id);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
