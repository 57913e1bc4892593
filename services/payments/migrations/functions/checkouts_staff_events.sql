-- The outbox writer of what staff do with a booking (docs/webhooks-out.md), in the statement that
-- does it (merchant_events_append: the event and its deliveries, as checkouts_merchant_events):
--   a staff-made checkout held (PENDING -> HELD)   booking.created_by_staff, with how it is paid
--   venue_status unpaid -> paid                     booking.paid_at_venue, with method, amount, reference
--   no_show_at set                                  booking.no_show
--   no_show_fee_status due -> charged | declined    booking.no_show_fee_charged | booking.no_show_fee_declined,
--                                                   with the fee, its payment and (declined) why
CREATE OR REPLACE FUNCTION checkouts_staff_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    IF NEW.state = 'HELD' AND OLD.state = 'PENDING' AND NEW.created_by IS NOT NULL THEN
        t := 'booking.created_by_staff';
    ELSIF NEW.venue_status = 'paid' AND OLD.venue_status IS DISTINCT FROM 'paid' THEN
        t := 'booking.paid_at_venue';
    ELSIF NEW.no_show_at IS NOT NULL AND OLD.no_show_at IS NULL THEN
        t := 'booking.no_show';
    ELSIF NEW.no_show_fee_status IN ('charged', 'declined') AND OLD.no_show_fee_status = 'due' THEN
        t := 'booking.no_show_fee_' || NEW.no_show_fee_status;
    ELSE
        RETURN NULL;
    END IF;
    PERFORM merchant_events_append(NEW.merchant_id, t, NEW.id, jsonb_build_object('checkout', jsonb_strip_nulls(jsonb_build_object(
            'id', NEW.id,
            'kind', NEW.kind,
            'state', NEW.state,
            'customer_id', NEW.customer_id,
            'amount', jsonb_build_object('amount_minor', NEW.amount_minor, 'currency_code', NEW.currency),
            'slot_id', NEW.slot_id,
            'salon_id', NEW.salon_id,
            'hold_id', NEW.hold_id,
            'start_time', to_char(NEW.start_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'settle', NEW.settle,
            'created_by', NEW.created_by,
            'link_expire_time', CASE WHEN NEW.settle = 'link'
                                     THEN to_char(NEW.expire_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
            'venue_payment', CASE WHEN t = 'booking.paid_at_venue' THEN jsonb_build_object(
                'method', NEW.venue_method, 'reference', NEW.venue_reference, 'paid_by', NEW.venue_paid_by,
                'amount', jsonb_build_object('amount_minor', NEW.venue_amount_minor, 'currency_code', NEW.currency)) END,
            'no_show_by', CASE WHEN t = 'booking.no_show' THEN NEW.no_show_by END,
            'no_show_fee', CASE WHEN NEW.no_show_fee_minor IS NOT NULL THEN jsonb_strip_nulls(jsonb_build_object(
                'amount', jsonb_build_object('amount_minor', NEW.no_show_fee_minor, 'currency_code', NEW.currency),
                'accept_time', to_char(NEW.no_show_fee_accepted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                'status', NEW.no_show_fee_status,
                'payment_id', NEW.no_show_fee_payment_id,
                'failure', NEW.no_show_fee_failure)) END,
            'create_time', to_char(NEW.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))));
    RETURN NULL;
END $$;
