-- The outbox writer (docs/webhooks-out.md): the state changes that are events, written in the
-- statement that makes them, so no state change without its event and no event without its state
-- change; each event is fanned out to the merchant's subscribed endpoints (webhook_deliveries) in
-- the same statement (merchant_events_append), so no crash can fall between the event and its
-- deliveries.
--   COMPLETED                 checkout.completed, and booking.confirmed or codes.delivered
--   REFUNDED                  checkout.refunded
--   CANCELLED_AFTER_PURCHASE  booking.cancelled, with the refund amount and the reason
-- A reschedule that succeeded (RESCHEDULE_CONFIRMING -> COMPLETED) is `booking.rescheduled` (never a
-- second checkout.completed / booking.confirmed); one reverted or refused (-> COMPLETED from
-- RESCHEDULING or RESCHEDULE_REVERTING) changed nothing a merchant sees: no event.
CREATE OR REPLACE FUNCTION checkouts_merchant_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    types text[];
    t     text;
BEGIN
    IF NEW.state = 'COMPLETED' AND OLD.state = 'RESCHEDULE_CONFIRMING' THEN
        types := ARRAY['booking.rescheduled'];
    ELSIF NEW.state = 'COMPLETED' AND OLD.state IN ('RESCHEDULING', 'RESCHEDULE_REVERTING') THEN
        RETURN NULL;
    ELSIF NEW.state = 'COMPLETED' THEN
        types := ARRAY['checkout.completed',
                       CASE NEW.kind WHEN 'booking' THEN 'booking.confirmed' ELSE 'codes.delivered' END];
    ELSIF NEW.state = 'REFUNDED' THEN
        types := ARRAY['checkout.refunded'];
    ELSIF NEW.state = 'CANCELLED_AFTER_PURCHASE' THEN
        types := ARRAY['booking.cancelled'];
    ELSE
        RETURN NULL;
    END IF;
    FOREACH t IN ARRAY types LOOP
        PERFORM merchant_events_append(NEW.merchant_id, t, NEW.id, jsonb_build_object('checkout', jsonb_strip_nulls(jsonb_build_object(
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
                'start_time', CASE WHEN t = 'booking.rescheduled'
                                   THEN to_char(NEW.start_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
                'previous_slot_id', CASE WHEN t = 'booking.rescheduled' THEN NEW.reschedule_from_slot_id END,
                'previous_hold_id', CASE WHEN t = 'booking.rescheduled' THEN NEW.reschedule_from_hold_id END,
                'previous_amount', CASE WHEN t = 'booking.rescheduled' THEN jsonb_build_object(
                    'amount_minor', OLD.amount_minor, 'currency_code', NEW.currency) END,
                'rescheduled_by', CASE WHEN t = 'booking.rescheduled' THEN NEW.rescheduled_by END,
                'difference_payment_id', CASE WHEN t = 'booking.rescheduled' THEN NEW.reschedule_payment_id END,
                'create_time', to_char(NEW.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))));
    END LOOP;
    RETURN NULL;
END $$;
