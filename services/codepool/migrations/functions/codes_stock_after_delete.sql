-- Codes deleted (only available ones may be): see codes_stock_after_insert.
CREATE OR REPLACE FUNCTION codes_stock_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM codepool_stock_count(array_agg(g.m), array_agg(g.p), array_agg(g.s), array_agg(g.status), array_agg(g.n))
      FROM (SELECT o.merchant_id AS m, o.product_id AS p, codepool_stock_slot(o.id) AS s, o.status, -count(*) AS n
            FROM old_codes o GROUP BY 1, 2, 3, 4) g
    HAVING count(*) > 0;
    RETURN NULL;
END $$;
