-- A product's available codes, counted up to p_limit: the fast path's test in codepool_stock_changed
-- (armed, and more than the threshold available as this statement sees it) and the recheck's. From
-- the newest codes backwards: reservations take the oldest first (ORDER BY seq), so the head of
-- codes_available is where their dead index entries pile up until vacuum, and a forward count walked
-- them all on every statement (measured: `make bench-stocklow`); the tail holds live codes only, so
-- threshold + 1 entries are a page or two.
CREATE OR REPLACE FUNCTION codepool_stock_available_upto(p_merchant_id text, p_product_id uuid, p_limit integer)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM (SELECT 1 FROM codes c
                          WHERE c.merchant_id = p_merchant_id AND c.product_id = p_product_id
                            AND c.status = 'available'
                          ORDER BY c.seq DESC
                          LIMIT p_limit) s
$$;
