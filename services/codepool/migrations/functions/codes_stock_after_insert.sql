-- Every statement that makes codes available or takes them (import, reserve, a late delivery's
-- re-take, release, expiry, and any hand-written SQL) fires one of codes_stock_after_insert,
-- codes_stock_after_update and codes_stock_after_delete: the `stock.low` event is written by the
-- statement that makes the change, whatever code ran it. This one: codes imported as available.
CREATE OR REPLACE FUNCTION codes_stock_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed jsonb;
BEGIN
    SELECT jsonb_agg(DISTINCT jsonb_build_object('m', n.merchant_id, 'p', n.product_id)) INTO changed
      FROM new_codes n WHERE n.status = 'available';
    IF changed IS NOT NULL THEN
        PERFORM codepool_stock_changed(changed);
    END IF;
    RETURN NULL;
END $$;
