-- One batch of the code pool's order retention (migration 0270, cutylib.retention): at most `batch`
-- orders that finished before `finished_before` (delivered ones by their delivery, released ones by
-- their release) and have no unresolved claim move, with their deliveries and payment transactions,
-- into the histories, oldest first, in this transaction: locked with FOR UPDATE SKIP LOCKED (an order
-- a live statement holds is left for a later batch: every writer of an order locks its reservation
-- row first, and a claim being opened holds it key-share; the lock rechecks the predicate on the
-- row's newest version, so an order re-reserved meanwhile by a late payment stays), copied, then
-- deleted (the delete guards let only moved rows go). Returns how many orders moved. Across
-- merchants: it sets the merchant to all for its own duration.
CREATE OR REPLACE FUNCTION reservations_move(batch integer, finished_before timestamptz)
RETURNS integer LANGUAGE plpgsql SET cuty.merchant = '*' AS $$
DECLARE
    ids text[];
    n integer;
BEGIN
    PERFORM cuty_move_batch(batch);
    SELECT array_agg(f.order_id) INTO ids FROM (
        SELECT r.order_id FROM reservations r
         WHERE r.status = 'delivered' AND r.delivered_at < finished_before
           AND NOT EXISTS (SELECT FROM code_claims k WHERE k.merchant_id = r.merchant_id AND k.order_id = r.order_id
                                                      AND k.status IN ('open', 'refunding'))
         ORDER BY r.delivered_at LIMIT batch FOR UPDATE OF r SKIP LOCKED) f;
    SELECT coalesce(ids, '{}') || coalesce(array_agg(f.order_id), '{}') INTO ids FROM (
        SELECT r.order_id FROM reservations r
         WHERE r.status = 'released' AND r.released_at < finished_before
         ORDER BY r.released_at LIMIT batch - coalesce(cardinality(ids), 0) FOR UPDATE OF r SKIP LOCKED) f;
    IF cardinality(ids) = 0 THEN
        RETURN 0;
    END IF;
    INSERT INTO reservations_history SELECT r.*, clock_timestamp() FROM reservations r WHERE r.order_id = ANY (ids);
    INSERT INTO deliveries_history
    SELECT d.*, clock_timestamp() FROM reservations r
      JOIN deliveries d ON d.merchant_id = r.merchant_id AND d.order_id = r.order_id
     WHERE r.order_id = ANY (ids);
    INSERT INTO payment_transactions_history
    SELECT t.*, clock_timestamp() FROM reservations r
      JOIN payment_transactions t ON t.merchant_id = r.merchant_id AND t.order_id = r.order_id
     WHERE r.order_id = ANY (ids);
    DELETE FROM deliveries d USING reservations r
     WHERE r.order_id = ANY (ids) AND d.merchant_id = r.merchant_id AND d.order_id = r.order_id;
    DELETE FROM payment_transactions t USING reservations r
     WHERE r.order_id = ANY (ids) AND t.merchant_id = r.merchant_id AND t.order_id = r.order_id;
    DELETE FROM reservations r WHERE r.order_id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
