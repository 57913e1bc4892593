-- Codes that changed status (reserve, delivery, release, expiry, a late delivery's re-take): each
-- leaves its old status and enters its new one; see codes_stock_after_insert. Key rotation changes
-- no status and counts nothing.
CREATE OR REPLACE FUNCTION codes_stock_after_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM codepool_stock_count(array_agg(g.m), array_agg(g.p), array_agg(g.s), array_agg(g.status), array_agg(g.n))
      FROM (SELECT n.merchant_id AS m, n.product_id AS p, codepool_stock_slot(n.id) AS s, x.status, sum(x.n) AS n
            FROM new_codes n JOIN old_codes o ON o.id = n.id
            CROSS JOIN LATERAL (VALUES (n.status, 1), (o.status, -1)) AS x(status, n)
            WHERE n.status <> o.status
            GROUP BY 1, 2, 3, 4) g
    HAVING count(*) > 0;
    RETURN NULL;
END $$;
