-- Live updates: every change of a checkout's state or version tells the listeners of the payments
-- processes (payments/checkout/live.py), in the transaction that made it: NOTIFY is delivered at
-- commit, so a watcher that hears it re-reads a row and events that are already there. A trigger,
-- not the statements: every writer (saga transitions, CreateCheckout, PayCheckout, CancelCheckout,
-- the wake-up trigger, operators' retries) is covered without repeating itself. One channel for
-- every checkout; the payload is the checkout id, and each process fans it out to the streams that
-- watch that checkout.
CREATE OR REPLACE FUNCTION checkouts_notify_watchers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cuty_checkout_events', NEW.id::text);
    RETURN NULL;
END $$;
