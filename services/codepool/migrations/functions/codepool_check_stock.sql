-- Re-decides one product's low-stock flag (products.stock_low) from its stock as committed plus this
-- transaction's own changes, and writes the `stock.low` event on the crossing (docs/codepool.md,
-- "Low stock"). The decision path: the caller holds the product's advisory lock ('codepool.stock:'
-- || product id, taken by codepool_stock_changed or codepool_stock_round) after its change and
-- until commit, so the deciders of one product run one at a time, and each statement below (a fresh
-- snapshot: VOLATILE plpgsql in READ COMMITTED) sees what every earlier decider committed. Two
-- reservations that cross the threshold together therefore write one event: the second sees the
-- first's codes gone and the flag set. The stock is the product's counter rows (product_stock).
-- The event is inserted under the lock 'codepool.stock_events', which keeps stock_events.seq in
-- commit order (the baseline's stock_events says why).
CREATE OR REPLACE FUNCTION codepool_check_stock(p_merchant_id text, p_product_id uuid) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    prod      record;
    available bigint;
    ev_id     uuid;
    ev_at     timestamptz;
BEGIN
    SELECT id, merchant_id, sku, name, low_stock_threshold, stock_low INTO prod
      FROM products WHERE merchant_id = p_merchant_id AND id = p_product_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    available := codepool_stock_available(p_merchant_id, p_product_id);
    IF available > prod.low_stock_threshold THEN
        -- replenished: re-arm
        UPDATE products SET stock_low = false WHERE merchant_id = p_merchant_id AND id = p_product_id AND stock_low;
        RETURN;
    END IF;
    -- at or below: announce on the crossing only (the flag was clear)
    UPDATE products SET stock_low = true WHERE merchant_id = p_merchant_id AND id = p_product_id AND NOT stock_low;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock_events', 0));
    ev_id := gen_random_uuid();
    ev_at := clock_timestamp();
    INSERT INTO stock_events (merchant_id, id, product_id, type, payload, created_at)
    VALUES (p_merchant_id, ev_id, p_product_id, 'stock.low', jsonb_build_object(
        'id', ev_id,
        'type', 'stock.low',
        'created', to_char(ev_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'merchant_id', p_merchant_id,
        'data', jsonb_build_object('product', jsonb_build_object(
            'id', p_product_id,
            'sku', prod.sku,
            'name', prod.name,
            'available', available,
            'low_stock_threshold', prod.low_stock_threshold))),
        ev_at);
    -- Wakes the orchestrator's relay at commit (it polls as well).
    PERFORM pg_notify('cuty_stock_events', p_merchant_id);
END $$;
