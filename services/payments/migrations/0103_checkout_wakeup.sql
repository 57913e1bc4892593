-- Issue 11, item 1: the database wakes the checkout saga when its payment changes status.
-- The trigger runs inside the statement that changed the payment (finalize's version-token UPDATE,
-- whatever wrote it), so the change, its event and the wake-up commit together in one round trip,
-- and the payments code needs to know nothing about checkouts: the dependency points from the
-- saga's schema to the payments table, not the other way round (docs/checkout.md, "Who drives a saga").
--
-- A free saga becomes due now, and every replica's claim loop hears the NOTIFY (delivered at
-- commit). A leased one gets `wakeup = true` instead: its holder may not release it to sleep until
-- it looked again (checkout/repository.py RELEASE), so no payment change is ever missed.
CREATE FUNCTION checkouts_wake_on_payment() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    leased boolean;
BEGIN
    UPDATE checkouts c SET
        payment_id = COALESCE(c.payment_id, NEW.id),
        wakeup = (c.lease_until IS NOT NULL AND c.lease_until > clock_timestamp()),
        next_run_at = CASE WHEN c.lease_until IS NOT NULL AND c.lease_until > clock_timestamp()
                           THEN c.next_run_at ELSE clock_timestamp() END
    WHERE c.id = NEW.checkout_id
      AND c.state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED', 'NEEDS_ATTENTION')
      AND c.payment_key IS NOT NULL
      AND (c.payment_id IS NULL OR c.payment_id = NEW.id)
    RETURNING c.wakeup INTO leased;
    IF FOUND AND NOT leased THEN
        PERFORM pg_notify('cuty_checkout_wake', NEW.checkout_id::text);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER payments_wake_checkout AFTER UPDATE OF status ON payments
    FOR EACH ROW
    WHEN (NEW.checkout_id IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION checkouts_wake_on_payment();
