-- Issue 12, item 5 (live updates): every change of a checkout's state or version tells the
-- listeners of the payments processes (payments/checkout/live.py), in the transaction that made
-- it: NOTIFY is delivered at commit, so a watcher that hears it re-reads a row and events that are
-- already there. A trigger, not the statements: every writer (saga transitions, CreateCheckout,
-- PayCheckout, CancelCheckout, the wake-up trigger, operators' retries) is covered without
-- repeating itself. One channel for every checkout; the payload is the checkout id, and each
-- process fans it out to the streams that watch that checkout.
CREATE FUNCTION checkouts_notify_watchers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cuty_checkout_events', NEW.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER checkouts_notify_watchers AFTER UPDATE OF state, version ON checkouts
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state OR NEW.version IS DISTINCT FROM OLD.version)
    EXECUTE FUNCTION checkouts_notify_watchers();

-- A watcher replays a checkout's transitions after an event id (the SSE Last-Event-ID):
-- payment_events_checkout (checkout_id, seq) already serves it.
