-- One stock round (docs/codepool.md, "Stock rounds"): for up to p_products products whose counter
-- rows changed since they were last summed (product_stock.dirty), in product id order:
--   * their sum is written to stock_summary, and the difference to stock_totals (what the stock
--     gauge reads: a page of an index and one row, whatever the catalogue);
--   * their low-stock flag is re-decided where it disagrees with the sum (what a race on
--     codepool_stock_changed's lock-free fast path leaves: two reservations that both saw "above"),
--     on the decision path under the product's lock (codepool_check_stock), so a `stock.low` is
--     never lost and never written twice for one crossing;
--   * their rows are marked clean, each only if its version is still the one read before the sum
--     (xmin) and no one holds it (SKIP LOCKED): a change made or still in flight after the read
--     keeps its row dirty for the next round.
-- Its cost is the products changed since the last round, not the catalogue. One round at a time
-- (a transaction-level try-lock: another replica's round returns at once, with nothing done), as
-- stock_totals is kept by differences. Locks: products' stock locks in product id order, like every
-- decider; the events' lock only inside codepool_check_stock, after them.
-- summarised: products summed (p_products: maybe more are waiting); redecided: flags re-decided.
CREATE OR REPLACE FUNCTION codepool_stock_round(p_products integer, OUT summarised integer, OUT redecided integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p record;
    was record;
    now_ record;
    read_m text[];
    read_p uuid[];
    read_s smallint[];
    read_x xid[];
    d_available bigint := 0;
    d_reserved bigint := 0;
    d_delivered bigint := 0;
    d_quarantined bigint := 0;
    d_revoked bigint := 0;
BEGIN
    summarised := 0;
    redecided := 0;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('codepool.stock_round', 0)) THEN
        RETURN;
    END IF;
    -- The changed rows of the first p_products changed products, as committed now (their versions).
    SELECT array_agg(s.merchant_id), array_agg(s.product_id), array_agg(s.slot), array_agg(s.xmin)
      INTO read_m, read_p, read_s, read_x
      FROM product_stock s
     WHERE s.dirty AND s.product_id IN (SELECT d.product_id FROM product_stock d WHERE d.dirty
                                        GROUP BY d.product_id ORDER BY d.product_id LIMIT p_products);
    FOR p IN SELECT DISTINCT m AS merchant_id, pid AS product_id FROM unnest(read_m, read_p) AS x(m, pid)
             ORDER BY 2 LOOP
        summarised := summarised + 1;
        SELECT coalesce(sum(s.available), 0) AS available, coalesce(sum(s.reserved), 0) AS reserved,
               coalesce(sum(s.delivered), 0) AS delivered, coalesce(sum(s.quarantined), 0) AS quarantined,
               coalesce(sum(s.revoked), 0) AS revoked
          INTO now_ FROM product_stock s WHERE s.merchant_id = p.merchant_id AND s.product_id = p.product_id;
        SELECT t.available, t.reserved, t.delivered, t.quarantined, t.revoked INTO was
          FROM stock_summary t WHERE t.merchant_id = p.merchant_id AND t.product_id = p.product_id;
        IF NOT FOUND THEN  -- a product created before its summary row could be (none since 0180)
            INSERT INTO stock_summary (merchant_id, product_id) VALUES (p.merchant_id, p.product_id);
            SELECT 0::bigint AS available, 0::bigint AS reserved, 0::bigint AS delivered, 0::bigint AS quarantined,
                   0::bigint AS revoked INTO was;
        END IF;
        IF (now_.available, now_.reserved, now_.delivered, now_.quarantined, now_.revoked)
           IS DISTINCT FROM (was.available, was.reserved, was.delivered, was.quarantined, was.revoked) THEN
            UPDATE stock_summary
               SET available = now_.available, reserved = now_.reserved, delivered = now_.delivered,
                   quarantined = now_.quarantined, revoked = now_.revoked
             WHERE merchant_id = p.merchant_id AND product_id = p.product_id;
            d_available := d_available + now_.available - was.available;
            d_reserved := d_reserved + now_.reserved - was.reserved;
            d_delivered := d_delivered + now_.delivered - was.delivered;
            d_quarantined := d_quarantined + now_.quarantined - was.quarantined;
            d_revoked := d_revoked + now_.revoked - was.revoked;
        END IF;
        IF EXISTS (SELECT 1 FROM products pr WHERE pr.merchant_id = p.merchant_id AND pr.id = p.product_id
                                               AND pr.stock_low <> (now_.available <= pr.low_stock_threshold)) THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.product_id::text, 0));
            PERFORM codepool_check_stock(p.merchant_id, p.product_id);
            redecided := redecided + 1;
        END IF;
    END LOOP;
    IF summarised = 0 THEN
        RETURN;
    END IF;
    UPDATE product_stock s SET dirty = false
      FROM (SELECT c.merchant_id, c.product_id, c.slot FROM product_stock c
             JOIN unnest(read_m, read_p, read_s, read_x) AS r(m, pid, slot, x)
               ON c.merchant_id = r.m AND c.product_id = r.pid AND c.slot = r.slot AND c.xmin = r.x
             WHERE c.dirty
             FOR UPDATE OF c SKIP LOCKED) unchanged
     WHERE s.merchant_id = unchanged.merchant_id AND s.product_id = unchanged.product_id AND s.slot = unchanged.slot;
    IF (d_available, d_reserved, d_delivered, d_quarantined, d_revoked) IS DISTINCT FROM (0, 0, 0, 0, 0) THEN
        UPDATE stock_totals
           SET available = available + d_available, reserved = reserved + d_reserved,
               delivered = delivered + d_delivered, quarantined = quarantined + d_quarantined,
               revoked = revoked + d_revoked;
    END IF;
END $$;
