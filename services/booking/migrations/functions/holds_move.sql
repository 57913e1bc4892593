-- One batch of the holds' retention (migration 0140, cutylib.retention): at most `batch` holds that
-- finished before `finished_before` (released or expired ones by their last change, confirmed
-- bookings by their end) move into holds_history, oldest first, in this transaction: locked with
-- FOR UPDATE SKIP LOCKED (a hold a live statement is changing is left for a later batch; the lock
-- rechecks the predicate on the row's newest version, so a hold confirmed meanwhile stays), copied,
-- then deleted (holds_delete_moved lets only a moved hold go). Returns how many moved. Across
-- merchants: it sets the merchant to all for its own duration.
CREATE OR REPLACE FUNCTION holds_move(batch integer, finished_before timestamptz)
RETURNS integer LANGUAGE plpgsql SET cuty.merchant = '*' AS $$
DECLARE
    ids uuid[];
    n integer;
BEGIN
    PERFORM cuty_move_batch(batch);
    SELECT array_agg(f.id) INTO ids FROM (
        SELECT h.id FROM holds h
         WHERE h.status IN ('released', 'expired') AND h.updated_at < finished_before
         ORDER BY h.updated_at LIMIT batch FOR UPDATE SKIP LOCKED) f;
    SELECT coalesce(ids, '{}') || coalesce(array_agg(f.id), '{}') INTO ids FROM (
        SELECT h.id FROM holds h
         WHERE h.status = 'confirmed' AND h.end_time < finished_before
         ORDER BY h.end_time LIMIT batch - coalesce(cardinality(ids), 0) FOR UPDATE SKIP LOCKED) f;
    IF cardinality(ids) = 0 THEN
        RETURN 0;
    END IF;
    INSERT INTO holds_history SELECT h.*, clock_timestamp() FROM holds h WHERE h.id = ANY (ids);
    DELETE FROM holds h WHERE h.id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
