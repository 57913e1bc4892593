-- Available codes deleted: see codes_stock_after_insert.
CREATE OR REPLACE FUNCTION codes_stock_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed jsonb;
BEGIN
    SELECT jsonb_agg(DISTINCT jsonb_build_object('m', o.merchant_id, 'p', o.product_id)) INTO changed
      FROM old_codes o WHERE o.status = 'available';
    IF changed IS NOT NULL THEN
        PERFORM codepool_stock_changed(changed);
    END IF;
    RETURN NULL;
END $$;
