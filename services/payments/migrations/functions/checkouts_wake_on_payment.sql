-- The database wakes the checkout saga when its payment changes status (trigger
-- payments_wake_checkout). The trigger runs inside the statement that changed the payment
-- (finalize's version-token UPDATE, whatever wrote it), so the change, its event and the wake-up
-- commit together in one round trip, and the payments code needs to know nothing about checkouts:
-- the dependency points from the saga's schema to the payments table, not the other way round
-- (docs/checkout.md, "Who drives a saga").
--
-- A free saga becomes due now, and every replica's claim loop hears the NOTIFY (delivered at
-- commit). A leased one gets `wakeup = true` instead: its holder may not release it to sleep until
-- it looked again (checkout/repository.py RELEASE), so no payment change is ever missed. A saga with
-- nothing left to do is not woken (nor is CANCELLED_AFTER_PURCHASE: a later refund by staff must
-- not queue a finished saga). A rescheduling saga's difference is a second payment of the checkout:
-- any change of a payment of a checkout in RESCHEDULING / RESCHEDULE_REVERTING wakes it, and never
-- becomes the checkout's payment_id (which stays the purchase's).
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
