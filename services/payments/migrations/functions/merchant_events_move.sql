-- One batch of the outbound retention (migration 0140, cutylib.retention): at most `batch` merchant
-- events, oldest first, created before `finished_before` and whose every delivery finished before
-- it (delivered, or failed after its retry window), move with their deliveries and attempt log into
-- the histories, in this transaction. The events are locked FOR UPDATE SKIP LOCKED, then their
-- deliveries FOR UPDATE (a redelivery queued meanwhile wins: its event stays, checked again under
-- the locks); copied, then deleted (merchant_events_delete_moved lets only a moved event go).
-- Returns how many events moved. Across merchants: it sets the merchant to all for its duration.
CREATE OR REPLACE FUNCTION merchant_events_move(batch integer, finished_before timestamptz)
RETURNS integer LANGUAGE plpgsql SET cuty.merchant = '*' AS $$
DECLARE
    ms text[];
    es uuid[];
    n integer;
BEGIN
    PERFORM cuty_move_batch(batch);
    SELECT array_agg(p.merchant_id), array_agg(p.id) INTO ms, es FROM (
        SELECT e.merchant_id, e.id FROM merchant_events e
         WHERE e.created_at < finished_before
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                            WHERE d.merchant_id = e.merchant_id AND d.event_id = e.id
                              AND (d.state = 'pending' OR d.lease_until IS NOT NULL
                                   OR coalesce(d.delivered_at, d.give_up_at) >= finished_before))
         ORDER BY e.created_at LIMIT batch FOR UPDATE OF e SKIP LOCKED) p;
    IF ms IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM webhook_deliveries d JOIN unnest(ms, es) m(merchant_id, id)
                ON m.merchant_id = d.merchant_id AND m.id = d.event_id
        ORDER BY d.merchant_id, d.id FOR UPDATE OF d;
    -- Under the locks, only the events whose deliveries are all still finished.
    SELECT array_agg(m.merchant_id), array_agg(m.id) INTO ms, es FROM unnest(ms, es) m(merchant_id, id)
     WHERE NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                        WHERE d.merchant_id = m.merchant_id AND d.event_id = m.id
                          AND (d.state = 'pending' OR d.lease_until IS NOT NULL
                               OR coalesce(d.delivered_at, d.give_up_at) >= finished_before));
    IF ms IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO merchant_events_history
        SELECT e.*, clock_timestamp() FROM merchant_events e
          JOIN unnest(ms, es) m(merchant_id, id) ON m.merchant_id = e.merchant_id AND m.id = e.id;
    INSERT INTO webhook_deliveries_history
        SELECT d.*, clock_timestamp() FROM webhook_deliveries d
          JOIN unnest(ms, es) m(merchant_id, id) ON m.merchant_id = d.merchant_id AND m.id = d.event_id;
    INSERT INTO webhook_attempts_history
        SELECT a.*, clock_timestamp() FROM webhook_attempts a
          JOIN webhook_deliveries d ON d.merchant_id = a.merchant_id AND d.id = a.delivery_id
          JOIN unnest(ms, es) m(merchant_id, id) ON m.merchant_id = d.merchant_id AND m.id = d.event_id;
    DELETE FROM webhook_attempts a USING webhook_deliveries d, unnest(ms, es) m(merchant_id, id)
     WHERE d.merchant_id = a.merchant_id AND d.id = a.delivery_id AND m.merchant_id = d.merchant_id AND m.id = d.event_id;
    DELETE FROM webhook_deliveries d USING unnest(ms, es) m(merchant_id, id)
     WHERE m.merchant_id = d.merchant_id AND m.id = d.event_id;
    DELETE FROM merchant_events e USING unnest(ms, es) m(merchant_id, id)
     WHERE m.merchant_id = e.merchant_id AND m.id = e.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
