-- Writes one merchant event into the code pool's outbox (stock_events; docs/codepool.md, "Claims,
-- replacement and batch quarantine"), in the caller's transaction: the event commits with the change
-- it describes, or neither does. Inserted under the lock 'codepool.stock_events', which keeps
-- stock_events.seq in commit order (the baseline's stock_events says why); such events are rare
-- (a claim, a batch held back), so the lock costs nothing on the hot path. An event about an order
-- names it (p_order_id), so the orchestrator's relay also writes it into that order's payment
-- timeline. Returns the event's id.
CREATE OR REPLACE FUNCTION codepool_emit_event(p_merchant_id text, p_product_id uuid, p_type text, p_order_id text,
                                               p_data jsonb) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ev_id uuid := gen_random_uuid();
    ev_at timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock_events', 0));
    ev_at := clock_timestamp();
    INSERT INTO stock_events (merchant_id, id, product_id, type, order_id, payload, created_at)
    VALUES (p_merchant_id, ev_id, p_product_id, p_type, p_order_id, jsonb_build_object(
        'id', ev_id,
        'type', p_type,
        'created', to_char(ev_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'merchant_id', p_merchant_id,
        'data', p_data), ev_at);
    -- Wakes the orchestrator's relay at commit (it polls as well).
    PERFORM pg_notify('cuty_stock_events', p_merchant_id);
    RETURN ev_id;
END $$;
