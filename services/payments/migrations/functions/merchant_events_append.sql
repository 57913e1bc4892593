-- One merchant event (docs/webhooks-out.md) in the statement that makes it: the row with its
-- envelope (id, type, created, merchant_id, data), its fan-out to the merchant's endpoints
-- subscribed to the type (webhook_deliveries), so no crash can fall between the event and its
-- deliveries, and the delivery workers' wake-up at commit (polling is the safety net). Used by
-- the triggers and functions that write merchant events; returns the event's id, or NULL (and
-- writes nothing) for no merchant: a checkout has none before its hold (checkouts_held_has_merchant),
-- so nothing past HELD meets it.
CREATE OR REPLACE FUNCTION merchant_events_append(p_merchant_id text, p_type text, p_checkout_id uuid,
                                                  p_data jsonb) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    ev_id uuid := gen_random_uuid();
    ev_at timestamptz := clock_timestamp();
BEGIN
    IF p_merchant_id IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO merchant_events (merchant_id, id, type, checkout_id, payload, created_at)
    VALUES (p_merchant_id, ev_id, p_type, p_checkout_id, jsonb_build_object(
        'id', ev_id,
        'type', p_type,
        'created', to_char(ev_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'merchant_id', p_merchant_id,
        'data', p_data), ev_at);
    INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, next_attempt_at, give_up_at, created_at)
    SELECT p_merchant_id, w.id, ev_id, ev_at, ev_at + interval '3 days', ev_at
    FROM webhook_endpoints w
    WHERE w.merchant_id = p_merchant_id AND p_type = ANY (w.events);
    PERFORM pg_notify('cuty_merchant_events', p_merchant_id);
    RETURN ev_id;
END $$;
