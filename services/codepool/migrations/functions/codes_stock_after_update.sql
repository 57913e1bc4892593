-- Codes that became available or stopped being so (reserve, release, expiry, a late delivery's
-- re-take): see codes_stock_after_insert. Delivery (reserved -> delivered) and key rotation do not
-- change the available stock and decide nothing.
CREATE OR REPLACE FUNCTION codes_stock_after_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed jsonb;
BEGIN
    SELECT jsonb_agg(DISTINCT jsonb_build_object('m', n.merchant_id, 'p', n.product_id)) INTO changed
      FROM new_codes n JOIN old_codes o ON o.id = n.id
     WHERE (n.status = 'available') <> (o.status = 'available');
    IF changed IS NOT NULL THEN
        PERFORM codepool_stock_changed(changed);
    END IF;
    RETURN NULL;
END $$;
