-- A product's available codes: the sum of its counter rows (product_stock), a few rows whatever
-- the number of codes. What the statement's snapshot sees: every committed change, and this
-- transaction's own; another transaction's change not committed yet is not counted.
CREATE OR REPLACE FUNCTION codepool_stock_available(p_merchant_id text, p_product_id uuid)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(s.available), 0)::bigint FROM product_stock s
    WHERE s.merchant_id = p_merchant_id AND s.product_id = p_product_id
$$;
