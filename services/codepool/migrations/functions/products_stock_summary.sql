-- Every product has its stock_summary row from its creation (zeros until its first codes), so the
-- stock gauge ranks a product never stocked too (last) and the stock round only updates rows.
CREATE OR REPLACE FUNCTION products_stock_summary() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO stock_summary (merchant_id, product_id) SELECT merchant_id, id FROM new_products;
    RETURN NULL;
END $$;
