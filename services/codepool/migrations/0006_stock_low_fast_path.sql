-- Issue 12, item 6, measured: 0005's per-product lock, taken by every statement that changes a
-- product's available stock and held until commit, serialised a hot product's reservations (32 in
-- flight on one product: 1,464 -> 768 reservations/s). The lock is only needed where an event or a
-- re-arm may be decided, so a statement now takes it only for the products that are near that:
--
--   * fast path (no lock, nothing written): the product's flag is clear (armed) and this statement
--     still sees more than its threshold available. Nothing would change under the lock either,
--     as far as this statement can see.
--   * decision path (0005's, unchanged): the flag is set (a re-arm may be due), or the statement
--     sees the stock at or below the threshold (an announcement may be due).
--
-- What the fast path cannot see: reservations of other transactions not committed yet count as
-- available to it. Two reservations racing past the threshold may both see "above" and both take
-- the fast path, leaving the flag armed while the stock is low (or, symmetrically, a re-arm racing a
-- reservation may leave it armed too early). codepool_stock_recheck() finds every product whose
-- flag disagrees with its stock and re-decides it on the decision path; the code pool runs it every
-- CUTY_STOCK_LOW_RECHECK_SECONDS (codepool/stock_events.py). So a `stock.low` is never lost: it is
-- written by the statement that crosses the threshold, or, in that race, by the recheck shortly
-- after; and never twice for one crossing (the flag, decided under the lock, says it was announced).

-- A product's available codes, counted up to p_limit: the fast path's test (armed, and more than
-- the threshold available as this statement sees it). From the newest codes backwards: reservations
-- take the oldest first (ORDER BY seq), so the head of codes_available is where their dead index
-- entries pile up until vacuum, and a forward count walked them all on every statement (measured:
-- `make bench-stocklow`); the tail holds live codes only, so threshold + 1 entries are a page or two.
CREATE FUNCTION codepool_stock_available_upto(p_merchant_id text, p_product_id uuid, p_limit integer)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM (SELECT 1 FROM codes c
                          WHERE c.merchant_id = p_merchant_id AND c.product_id = p_product_id
                            AND c.status = 'available'
                          ORDER BY c.seq DESC
                          LIMIT p_limit) s
$$;

CREATE OR REPLACE FUNCTION codepool_stock_changed(p_changed jsonb) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p record;
    near uuid[] := '{}';
    merchants text[] := '{}';
BEGIN
    -- Lock the products near a decision (in product id order: two statements never wait on each
    -- other in a cycle), then decide those. 0005 locked and decided every changed product.
    FOR p IN SELECT DISTINCT x->>'m' AS merchant_id, (x->>'p')::uuid AS product_id
             FROM jsonb_array_elements(p_changed) x ORDER BY 2 LOOP
        IF NOT EXISTS (SELECT 1 FROM products pr
                       WHERE pr.merchant_id = p.merchant_id AND pr.id = p.product_id AND NOT pr.stock_low
                         AND codepool_stock_available_upto(pr.merchant_id, pr.id, pr.low_stock_threshold + 1)
                             > pr.low_stock_threshold) THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.product_id::text, 0));
            near := near || p.product_id;
            merchants := merchants || p.merchant_id;
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(near, 1), 0) LOOP
        PERFORM codepool_check_stock(merchants[i], near[i]);
    END LOOP;
END $$;

-- Every product whose flag disagrees with its committed stock, re-decided on the decision path (in
-- product id order, as statements lock them). Returns how many were re-decided.
CREATE FUNCTION codepool_stock_recheck() RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p record;
    n integer := 0;
BEGIN
    FOR p IN SELECT pr.merchant_id, pr.id FROM products pr
             WHERE pr.stock_low <> (codepool_stock_available_upto(pr.merchant_id, pr.id, pr.low_stock_threshold + 1)
                                    <= pr.low_stock_threshold)
             ORDER BY pr.id LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.id::text, 0));
        PERFORM codepool_check_stock(p.merchant_id, p.id);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
