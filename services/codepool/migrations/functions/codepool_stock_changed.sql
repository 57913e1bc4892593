-- The products a statement changed the available stock of (codepool_stock_count), re-decided where a
-- decision may be due. A per-product lock taken by every such statement and held until commit would
-- serialise a hot product's reservations (measured: 32 in flight on one product, 1,464 -> 768
-- reservations/s), so the lock is taken only for the products near a decision:
--
--   * fast path (no lock, nothing written): the product's flag is clear (armed) and this statement
--     still sees more than its threshold available. Nothing would change under the lock either,
--     as far as this statement can see.
--   * decision path (codepool_check_stock, under the product's lock): the flag is set (a re-arm may
--     be due), or the statement sees the stock at or below the threshold (an announcement may be due).
--
-- What the fast path cannot see: reservations of other transactions not committed yet count as
-- available to it. Two reservations racing past the threshold may both see "above" and both take
-- the fast path, leaving the flag armed while the stock is low (or, symmetrically, a re-arm racing a
-- reservation may leave it armed too early); the next stock round (codepool_stock_round, every few
-- seconds) repairs that: the statement marked the counter rows it changed.
-- The products' locks are taken in product id order, so two statements never wait on each other in
-- a cycle; the events' lock ('codepool.stock_events') is only ever taken after all of them.
CREATE OR REPLACE FUNCTION codepool_stock_changed(p_changed jsonb) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p record;
    near uuid[] := '{}';
    merchants text[] := '{}';
BEGIN
    -- Lock the products near a decision (in product id order: two statements never wait on each
    -- other in a cycle), then decide those.
    FOR p IN SELECT DISTINCT x->>'m' AS merchant_id, (x->>'p')::uuid AS product_id
             FROM jsonb_array_elements(p_changed) x ORDER BY 2 LOOP
        IF NOT EXISTS (SELECT 1 FROM products pr
                       WHERE pr.merchant_id = p.merchant_id AND pr.id = p.product_id AND NOT pr.stock_low
                         AND codepool_stock_available(pr.merchant_id, pr.id) > pr.low_stock_threshold) THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.product_id::text, 0));
            near := near || p.product_id;
            merchants := merchants || p.merchant_id;
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(near, 1), 0) LOOP
        PERFORM codepool_check_stock(merchants[i], near[i]);
    END LOOP;
END $$;
