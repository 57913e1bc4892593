-- Issue 12: `booking.cancelled`, the outbox event of a cancellation after purchase (0160). The
-- outbox writer of 0150 with one more state, CANCELLED_AFTER_PURCHASE, whose event carries the
-- refund amount and the reason; written in the statement that makes the state change, like the
-- others (no state change without its event, no event without its state change).
ALTER TABLE merchant_events DROP CONSTRAINT merchant_events_type_check;
ALTER TABLE merchant_events ADD CONSTRAINT merchant_events_type_check CHECK (type IN (
    'checkout.completed', 'booking.confirmed', 'codes.delivered', 'checkout.refunded', 'booking.cancelled'));

CREATE OR REPLACE FUNCTION checkouts_merchant_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    types  text[];
    t      text;
    ev_id  uuid;
    ev_at  timestamptz;
BEGIN
    IF NEW.state = 'COMPLETED' THEN
        types := ARRAY['checkout.completed',
                       CASE NEW.kind WHEN 'booking' THEN 'booking.confirmed' ELSE 'codes.delivered' END];
    ELSIF NEW.state = 'REFUNDED' THEN
        types := ARRAY['checkout.refunded'];
    ELSIF NEW.state = 'CANCELLED_AFTER_PURCHASE' THEN
        types := ARRAY['booking.cancelled'];
    ELSE
        RETURN NULL;
    END IF;
    IF NEW.merchant_id IS NULL THEN  -- impossible past HELD (checkouts_held_has_merchant)
        RETURN NULL;
    END IF;
    FOREACH t IN ARRAY types LOOP
        ev_id := gen_random_uuid();
        ev_at := clock_timestamp();
        INSERT INTO merchant_events (merchant_id, id, type, checkout_id, payload, created_at)
        VALUES (NEW.merchant_id, ev_id, t, NEW.id, jsonb_build_object(
            'id', ev_id,
            'type', t,
            'created', to_char(ev_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'merchant_id', NEW.merchant_id,
            'data', jsonb_build_object('checkout', jsonb_strip_nulls(jsonb_build_object(
                'id', NEW.id,
                'kind', NEW.kind,
                'state', NEW.state,
                'amount', jsonb_build_object('amount_minor', NEW.amount_minor, 'currency_code', NEW.currency),
                'slot_id', NEW.slot_id,
                'salon_id', NEW.salon_id,
                'product_id', NEW.product_id,
                'quantity', CASE WHEN NEW.kind = 'codes' THEN NEW.quantity END,
                'hold_id', NEW.hold_id,
                'order_id', NEW.order_id,
                'payment_id', NEW.payment_id,
                'refund_amount', CASE WHEN NEW.refund_amount_minor IS NOT NULL THEN jsonb_build_object(
                    'amount_minor', NEW.refund_amount_minor, 'currency_code', NEW.currency) END,
                'cancel_reason', NULLIF(NEW.cancel_reason, ''),
                'create_time', to_char(NEW.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))))),
            ev_at);
        INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, next_attempt_at, give_up_at, created_at)
        SELECT NEW.merchant_id, w.id, ev_id, ev_at, ev_at + interval '3 days', ev_at
        FROM webhook_endpoints w
        WHERE w.merchant_id = NEW.merchant_id AND t = ANY (w.events);
    END LOOP;
    -- Wakes the delivery workers of every replica at commit (polling is the safety net).
    PERFORM pg_notify('cuty_merchant_events', NEW.merchant_id);
    RETURN NULL;
END $$;

DROP TRIGGER checkouts_merchant_events ON checkouts;
CREATE TRIGGER checkouts_merchant_events AFTER UPDATE OF state ON checkouts
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state AND NEW.state IN ('COMPLETED', 'REFUNDED', 'CANCELLED_AFTER_PURCHASE'))
    EXECUTE FUNCTION checkouts_merchant_events();
