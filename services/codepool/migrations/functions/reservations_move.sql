-- One batch of the code pool's order retention (migration 0270, cutylib.retention): at most `batch`
-- orders that finished before `finished_before` (delivered ones by their delivery, released ones by
-- their release) and have no unresolved claim move, with their deliveries and payment transactions,
-- into the histories, oldest first, in this transaction: locked with FOR UPDATE SKIP LOCKED (an order
-- a live statement holds is left for a later batch: every writer of an order locks its reservation
-- row first, and a claim being opened holds it key-share; the lock rechecks the predicate on the
-- row's newest version, so an order re-reserved meanwhile by a late payment stays), deleted and
-- copied in one statement each (the delete guards let only moved rows go). Returns how many orders moved. Across
-- merchants: it sets the merchant to all for its own duration.
CREATE OR REPLACE FUNCTION reservations_move(batch integer, finished_before timestamptz)
RETURNS integer LANGUAGE plpgsql SET cuty.merchant = '*' AS $$
DECLARE
    tids tid[];
    merchants text[];
    orders text[];
    n integer;
BEGIN
    PERFORM cuty_move_batch(batch);
    -- The picked rows are found again by their row ids (a TID scan) and their children by
    -- (merchant, order) through the children's order indexes: no statement of a batch walks a table.
    SELECT array_agg(f.tid), array_agg(f.merchant_id), array_agg(f.order_id) INTO tids, merchants, orders FROM (
        SELECT r.ctid AS tid, r.merchant_id, r.order_id FROM reservations r
         WHERE r.status = 'delivered' AND r.delivered_at < finished_before
           AND NOT EXISTS (SELECT FROM code_claims k WHERE k.merchant_id = r.merchant_id AND k.order_id = r.order_id
                                                      AND k.status IN ('open', 'refunding'))
         ORDER BY r.delivered_at LIMIT batch FOR UPDATE OF r SKIP LOCKED) f;
    SELECT coalesce(tids, '{}') || coalesce(array_agg(f.tid), '{}'),
           coalesce(merchants, '{}') || coalesce(array_agg(f.merchant_id), '{}'),
           coalesce(orders, '{}') || coalesce(array_agg(f.order_id), '{}')
      INTO tids, merchants, orders FROM (
        SELECT r.ctid AS tid, r.merchant_id, r.order_id FROM reservations r
         WHERE r.status = 'released' AND r.released_at < finished_before
         ORDER BY r.released_at LIMIT batch - coalesce(cardinality(tids), 0) FOR UPDATE OF r SKIP LOCKED) f;
    -- The claims again, with this statement's fresh snapshot: a claim that held its reservation
    -- key-share and committed while the pick above ran is invisible to the pick's snapshot, and its
    -- row, locked but never updated, is not rechecked. The picked rows are locked now, so no claim
    -- can open on them any more, and every claim that did is visible here.
    SELECT coalesce(array_agg(t.tid), '{}'), coalesce(array_agg(t.m), '{}'), coalesce(array_agg(t.o), '{}')
      INTO tids, merchants, orders
      FROM unnest(tids, merchants, orders) t (tid, m, o)
     WHERE NOT EXISTS (SELECT FROM code_claims k WHERE k.merchant_id = t.m AND k.order_id = t.o
                                                  AND k.status IN ('open', 'refunding'));
    IF cardinality(tids) = 0 THEN
        RETURN 0;
    END IF;
    -- Children first (their foreign keys name the reservation); each leaves by a DELETE whose rows
    -- go into the history in the same statement, which the delete guard checks at its end.
    WITH gone AS (
        DELETE FROM deliveries d USING unnest(merchants, orders) o (merchant_id, order_id)
         WHERE d.merchant_id = o.merchant_id AND d.order_id = o.order_id RETURNING d.*)
    INSERT INTO deliveries_history SELECT g.*, clock_timestamp() FROM gone g;
    WITH gone AS (
        DELETE FROM payment_transactions t USING unnest(merchants, orders) o (merchant_id, order_id)
         WHERE t.merchant_id = o.merchant_id AND t.order_id = o.order_id RETURNING t.*)
    INSERT INTO payment_transactions_history SELECT g.*, clock_timestamp() FROM gone g;
    WITH gone AS (DELETE FROM reservations r WHERE r.ctid = ANY (tids) RETURNING r.*)
    INSERT INTO reservations_history SELECT g.*, clock_timestamp() FROM gone g;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
