-- Issue 12, item 2: reschedule a COMPLETED booking to another slot of its salon (docs/checkout.md,
-- "Reschedule").
--
-- The same saga row, the same workers, leases, retries and NEEDS_ATTENTION as every other step:
--   COMPLETED -> RESCHEDULING          hold the new slot (booking.HoldSlot, the database decides a race);
--                                      a price increase: charge the difference (a second payment)
--   RESCHEDULING -> RESCHEDULE_CONFIRMING  confirm the new hold, cancel the old booking
--                                      (booking.CancelBooking), refund a price decrease -> COMPLETED
--   RESCHEDULING | RESCHEDULE_CONFIRMING -> RESCHEDULE_REVERTING  compensation: cancel / refund the
--                                      difference's payment, release the new hold -> COMPLETED (unchanged)
--   RESCHEDULING -> COMPLETED          the new slot was refused at once (taken: nothing to undo)
-- The old booking is given up only after the new one is confirmed, and the new one is confirmed only
-- after its difference was captured: never both lost; the old one is released in the step that
-- confirmed the new one, repeated until done: never both kept once the saga is COMPLETED.

ALTER TABLE checkouts DROP CONSTRAINT checkouts_state_check;
ALTER TABLE checkouts ADD CONSTRAINT checkouts_state_check CHECK (state IN (
    'PENDING', 'HELD', 'CHARGING', 'AWAITING_ACTION', 'CONFIRMING', 'COMPLETED', 'RELEASING',
    'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDING', 'REFUNDED', 'NEEDS_ATTENTION',
    'CANCELLING', 'CANCELLED_AFTER_PURCHASE', 'RESCHEDULING', 'RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING'));
ALTER TABLE checkouts DROP CONSTRAINT checkouts_attention_from_check;
ALTER TABLE checkouts ADD CONSTRAINT checkouts_attention_from_check
    CHECK (attention_from IN ('CONFIRMING', 'RELEASING', 'REFUNDING', 'CANCELLING', 'RESCHEDULING',
                              'RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING'));

-- RescheduleCheckout answers an Idempotency-Key like CreateCheckout and PayCheckout.
ALTER TABLE checkout_idempotency_keys DROP CONSTRAINT checkout_idempotency_keys_operation_check;
ALTER TABLE checkout_idempotency_keys ADD CONSTRAINT checkout_idempotency_keys_operation_check
    CHECK (operation IN ('create', 'pay', 'reschedule'));

-- The reschedule under way (or the last one): written by START_RESCHEDULE (which resets the facts of
-- the previous one and numbers this one: its steps' idempotency keys carry the number), learned by
-- its steps, and on success swapped into slot_id / hold_id / amount_minor / start_time.
ALTER TABLE checkouts
    ADD COLUMN reschedule_seq integer NOT NULL DEFAULT 0 CHECK (reschedule_seq >= 0),
    ADD COLUMN reschedules integer NOT NULL DEFAULT 0 CHECK (reschedules >= 0 AND reschedules <= reschedule_seq),
    ADD COLUMN reschedule_status text CHECK (reschedule_status IN ('in_progress', 'rescheduled', 'reverted')),
    ADD COLUMN reschedule_slot_id uuid,
    ADD COLUMN reschedule_from_slot_id uuid,
    ADD COLUMN reschedule_from_hold_id text,
    ADD COLUMN reschedule_from_amount_minor bigint,
    ADD COLUMN reschedule_hold_id text,
    ADD COLUMN reschedule_amount_minor bigint CHECK (reschedule_amount_minor >= 0),
    ADD COLUMN reschedule_start_time timestamptz,
    ADD COLUMN reschedule_expire_time timestamptz,
    ADD COLUMN reschedule_payment_method text,
    ADD COLUMN reschedule_payment_id uuid,
    ADD COLUMN rescheduled_by text,
    ADD COLUMN reschedule_failure text NOT NULL DEFAULT '',
    ADD CONSTRAINT checkouts_reschedule_whole CHECK (
        (state NOT IN ('RESCHEDULING', 'RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING')
         OR (reschedule_status = 'in_progress' AND reschedule_slot_id IS NOT NULL))
        AND (state NOT IN ('RESCHEDULE_CONFIRMING') OR reschedule_hold_id IS NOT NULL)
        AND ((reschedule_status IS NULL) = (reschedule_slot_id IS NULL)));

-- The trigger as 0160 left it, with the reschedule's transitions. One reschedule at a time per
-- checkout: it is a state of the row, entered only from COMPLETED.
CREATE OR REPLACE FUNCTION checkouts_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version <> OLD.version AND NEW.version <> OLD.version + 1 THEN
        RAISE EXCEPTION 'checkout % version must rise by one, % -> %', OLD.id, OLD.version, NEW.version
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NEW.version <> OLD.version + 1 THEN
            RAISE EXCEPTION 'checkout % state change without a version bump', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NOT (
            (OLD.state = 'PENDING' AND NEW.state IN ('HELD', 'REJECTED'))
            OR (OLD.state = 'HELD' AND NEW.state IN ('CHARGING', 'RELEASING'))
            OR (OLD.state = 'CHARGING' AND NEW.state IN ('AWAITING_ACTION', 'CONFIRMING', 'RELEASING'))
            OR (OLD.state = 'AWAITING_ACTION' AND NEW.state IN ('CHARGING', 'CONFIRMING', 'RELEASING'))
            OR (OLD.state = 'CONFIRMING' AND NEW.state IN ('COMPLETED', 'REFUNDING', 'NEEDS_ATTENTION'))
            OR (OLD.state = 'RELEASING' AND NEW.state IN ('FAILED', 'EXPIRED', 'CANCELLED', 'CONFIRMING', 'REFUNDING',
                                                          'NEEDS_ATTENTION'))
            OR (OLD.state = 'REFUNDING' AND NEW.state IN ('REFUNDED', 'NEEDS_ATTENTION'))
            -- issue 12: a completed booking cancelled after purchase (refund per its policy, then the slot)
            --           or rescheduled (the new slot held, paid, confirmed; then the old one released)
            OR (OLD.state = 'COMPLETED' AND NEW.state IN ('CANCELLING', 'RESCHEDULING'))
            OR (OLD.state = 'CANCELLING' AND NEW.state IN ('CANCELLED_AFTER_PURCHASE', 'NEEDS_ATTENTION'))
            OR (OLD.state = 'RESCHEDULING' AND NEW.state IN ('RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING',
                                                             'COMPLETED', 'NEEDS_ATTENTION'))
            OR (OLD.state = 'RESCHEDULE_CONFIRMING' AND NEW.state IN ('COMPLETED', 'RESCHEDULE_REVERTING',
                                                                      'NEEDS_ATTENTION'))
            OR (OLD.state = 'RESCHEDULE_REVERTING' AND NEW.state IN ('COMPLETED', 'NEEDS_ATTENTION'))
            -- an operator's retry: back to the step that kept failing
            OR (OLD.state = 'NEEDS_ATTENTION' AND NEW.state = OLD.attention_from)
        ) THEN
            RAISE EXCEPTION 'checkout % may not move from % to %', OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF OLD.payment_key IS NOT NULL AND NEW.payment_key IS DISTINCT FROM OLD.payment_key THEN
        RAISE EXCEPTION 'checkout % payment attempt may not change', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.payment_id IS NOT NULL AND NEW.payment_id IS DISTINCT FROM OLD.payment_id THEN
        RAISE EXCEPTION 'checkout % payment may not change', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

-- A payment change wakes its saga (0103, 0160). A rescheduling saga's difference is a second payment
-- of the checkout: any change of a payment of a checkout in RESCHEDULING / RESCHEDULE_REVERTING wakes
-- it, and never becomes the checkout's payment_id (which stays the purchase's).
CREATE OR REPLACE FUNCTION checkouts_wake_on_payment() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    leased boolean;
BEGIN
    UPDATE checkouts c SET
        payment_id = CASE WHEN c.state IN ('RESCHEDULING', 'RESCHEDULE_REVERTING') THEN c.payment_id
                          ELSE COALESCE(c.payment_id, NEW.id) END,
        wakeup = (c.lease_until IS NOT NULL AND c.lease_until > clock_timestamp()),
        next_run_at = CASE WHEN c.lease_until IS NOT NULL AND c.lease_until > clock_timestamp()
                           THEN c.next_run_at ELSE clock_timestamp() END
    WHERE c.id = NEW.checkout_id
      AND c.state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED', 'NEEDS_ATTENTION',
                            'CANCELLED_AFTER_PURCHASE')
      AND c.payment_key IS NOT NULL
      AND ((c.payment_id IS NULL AND c.state NOT IN ('RESCHEDULING', 'RESCHEDULE_REVERTING'))
           OR c.payment_id = NEW.id
           OR c.state IN ('RESCHEDULING', 'RESCHEDULE_REVERTING'))
    RETURNING c.wakeup INTO leased;
    IF FOUND AND NOT leased THEN
        PERFORM pg_notify('cuty_checkout_wake', NEW.checkout_id::text);
    END IF;
    RETURN NULL;
END $$;

-- booking.rescheduled: the outbox writer of 0161 with the reschedule's end. A reschedule that
-- succeeded (RESCHEDULE_CONFIRMING -> COMPLETED) is `booking.rescheduled` (never a second
-- checkout.completed / booking.confirmed); one reverted or refused (-> COMPLETED from RESCHEDULING or
-- RESCHEDULE_REVERTING) changed nothing a merchant sees: no event.
ALTER TABLE merchant_events DROP CONSTRAINT merchant_events_type_check;
ALTER TABLE merchant_events ADD CONSTRAINT merchant_events_type_check CHECK (type IN (
    'checkout.completed', 'booking.confirmed', 'codes.delivered', 'checkout.refunded', 'booking.cancelled',
    'booking.rescheduled'));

CREATE OR REPLACE FUNCTION checkouts_merchant_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    types  text[];
    t      text;
    ev_id  uuid;
    ev_at  timestamptz;
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
                'start_time', CASE WHEN t = 'booking.rescheduled'
                                   THEN to_char(NEW.start_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
                'previous_slot_id', CASE WHEN t = 'booking.rescheduled' THEN NEW.reschedule_from_slot_id END,
                'previous_hold_id', CASE WHEN t = 'booking.rescheduled' THEN NEW.reschedule_from_hold_id END,
                'previous_amount', CASE WHEN t = 'booking.rescheduled' THEN jsonb_build_object(
                    'amount_minor', OLD.amount_minor, 'currency_code', NEW.currency) END,
                'rescheduled_by', CASE WHEN t = 'booking.rescheduled' THEN NEW.rescheduled_by END,
                'difference_payment_id', CASE WHEN t = 'booking.rescheduled' THEN NEW.reschedule_payment_id END,
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
