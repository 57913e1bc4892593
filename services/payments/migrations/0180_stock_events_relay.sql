-- Issue 12, item 6: `stock.low`, relayed from the code pool's outbox (codepool migration 0005,
-- docs/webhooks-out.md "stock.low: relayed from the code pool"). The code pool writes the event in
-- the statement that changes the stock; the orchestrator's relay (payments/outbound/relay.py) reads
-- it with ListStockEvents(after_seq) and, in one transaction, stores it here (ON CONFLICT on its
-- id: a re-read event is stored once), fans it out to the subscribed endpoints and advances its
-- cursor. A crash on either side loses nothing (the cursor moves only with the events it covers)
-- and duplicates nothing (the event id).
ALTER TABLE merchant_events DROP CONSTRAINT merchant_events_type_check;
ALTER TABLE merchant_events ADD CONSTRAINT merchant_events_type_check CHECK (type IN (
    'checkout.completed', 'booking.confirmed', 'codes.delivered', 'checkout.refunded', 'booking.cancelled',
    'booking.rescheduled', 'stock.low'));

-- One row per feed the relay reads: how far it has stored. The row is the relay's lock too: a replica
-- relays while it holds the row FOR UPDATE (SKIP LOCKED: the others skip a round), and a replica that
-- dies mid-round drops the lock with its connection.
CREATE TABLE outbound_feeds (
    feed       text PRIMARY KEY CHECK (feed IN ('codepool.stock')),
    after_seq  bigint NOT NULL DEFAULT 0 CHECK (after_seq >= 0),
    relayed    bigint NOT NULL DEFAULT 0 CHECK (relayed >= 0),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO outbound_feeds (feed) VALUES ('codepool.stock');

-- The cursor only moves forward.
CREATE FUNCTION outbound_feeds_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.after_seq < OLD.after_seq THEN
        RAISE EXCEPTION 'feed %: cursor % -> % goes back', OLD.feed, OLD.after_seq, NEW.after_seq
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER outbound_feeds_forward BEFORE UPDATE ON outbound_feeds FOR EACH ROW
    EXECUTE FUNCTION outbound_feeds_forward();
