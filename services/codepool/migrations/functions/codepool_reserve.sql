-- ReserveCodes in one statement (codepool/repository.py, RESERVE, says what it does and why). A
-- function so that it can say whose rows it works on in the same round trip: the orchestrator and
-- customers reserve any merchant's product (SET cuty.merchant = '*', for the call only; the
-- merchant is the product row's). Behind PgBouncer in transaction mode a setting cannot come with
-- the connection (docs/tenancy.md).
CREATE OR REPLACE FUNCTION codepool_reserve(p_order_id text, p_order_item_id text, p_product_id uuid,
                                            p_customer_id text, p_quantity integer, p_ttl_seconds double precision,
                                            p_actor text, p_max_active integer, p_max_quantity integer)
RETURNS TABLE (reservation reservations, code_ids uuid[])
LANGUAGE plpgsql SET cuty.merchant = '*' AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH cap AS MATERIALIZED (
        -- the per-customer caps (migrations/functions/codepool_customer_cap.sql): raises CP002 / CP003 when over
        SELECT codepool_customer_cap(p_customer_id, p_product_id, p_order_id, p_order_item_id, p_quantity, p_max_active, p_max_quantity, p.merchant_id) AS ok
        FROM products p WHERE p.id = p_product_id
    ), r AS (
        INSERT INTO reservations (merchant_id, order_id, order_item_id, product_id, customer_id, quantity,
                                  unit_price_minor, currency, status, reserved_at, expires_at)
        SELECT p.merchant_id, p_order_id, p_order_item_id, p.id, p_customer_id, p_quantity, p.price_minor, p.currency, 'reserved', clock_timestamp(),
               clock_timestamp() + make_interval(secs => p_ttl_seconds)
        FROM cap, products p WHERE cap.ok AND p.id = p_product_id
        ON CONFLICT DO NOTHING
        RETURNING *
    ), picked AS (
        SELECT c.id FROM codes c
        WHERE c.merchant_id = (SELECT r.merchant_id FROM r) AND c.product_id = p_product_id AND c.status = 'available'
        ORDER BY c.seq
        LIMIT p_quantity
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        UPDATE codes c SET status = 'reserved' FROM picked WHERE c.id = picked.id RETURNING c.id
    ), d AS (
        INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status)
        SELECT r.merchant_id, p_order_id, p_order_item_id, p_product_id, p_customer_id, taken.id, 'reserved' FROM r, taken
        RETURNING code_id
    ), a AS (
        INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
        SELECT r.merchant_id, p_actor, 'reserve', r.product_id, r.order_id, (SELECT array_agg(code_id ORDER BY code_id) FROM d),
               jsonb_build_object('quantity', r.quantity)
        FROM r
    )
    SELECT r::reservations, got.code_ids
    FROM r, (SELECT array_agg(code_id ORDER BY code_id) AS code_ids, count(*) AS n FROM d) got
    -- CASE, not OR: SQL does not promise to evaluate OR left to right.
    WHERE CASE WHEN got.n = r.quantity THEN true ELSE codepool_short_stock(r.quantity, got.n) END;
END
$fn$;
