-- Every statement that changes codes (import, reserve, a late delivery's re-take, delivery,
-- release, expiry, and any hand-written SQL) fires one of codes_stock_after_insert,
-- codes_stock_after_update and codes_stock_after_delete, which pass what it changed, grouped by
-- product, counter slot and status, to codepool_stock_count: the stock counters and the
-- `stock.low` event are written by the statement that makes the change, whatever code ran it.
-- This one: codes imported.
CREATE OR REPLACE FUNCTION codes_stock_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM codepool_stock_count(array_agg(g.m), array_agg(g.p), array_agg(g.s), array_agg(g.status), array_agg(g.n))
      FROM (SELECT n.merchant_id AS m, n.product_id AS p, codepool_stock_slot(n.id) AS s, n.status, count(*) AS n
            FROM new_codes n GROUP BY 1, 2, 3, 4) g
    HAVING count(*) > 0;
    RETURN NULL;
END $$;
