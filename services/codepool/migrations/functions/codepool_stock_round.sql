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
-- Its cost is the products changed since the last round, not the catalogue: a few set-based
-- statements over them (a statement per product cost 2-3 ms each under load). One round at a time
-- (a transaction-level try-lock: another replica's round returns at once, with nothing done), as
-- stock_totals is kept by differences. Locks: products' stock locks in product id order, like every
-- decider; the events' lock only inside codepool_check_stock, after them.
-- summarised: products summed (p_products: maybe more are waiting); redecided: flags re-decided.
CREATE OR REPLACE FUNCTION codepool_stock_round(p_products integer, OUT summarised integer, OUT redecided integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p record;
    read_m text[];
    read_p uuid[];
    read_s smallint[];
    read_x xid[];
BEGIN
    summarised := 0;
    redecided := 0;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('codepool.stock_round', 0)) THEN
        RETURN;
    END IF;
    -- The first p_products changed products (a walk of the partial index product_stock_dirty), then
    -- their changed rows as committed now (their versions).
    SELECT array_agg(d.product_id) INTO read_p
      FROM (SELECT DISTINCT s.product_id FROM product_stock s WHERE s.dirty ORDER BY s.product_id
            LIMIT p_products) d;
    IF read_p IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(s.merchant_id), array_agg(s.product_id), array_agg(s.slot), array_agg(s.xmin)
      INTO read_m, read_p, read_s, read_x
      FROM product_stock s
     WHERE s.dirty AND s.product_id = ANY(read_p);
    IF read_p IS NULL THEN
        RETURN;
    END IF;
    -- Their sums (a later snapshot: every version read above, or a newer one), written where they
    -- changed, and the differences added to the totals.
    WITH changed AS (
        SELECT DISTINCT r.m AS merchant_id, r.pid AS product_id FROM unnest(read_m, read_p) AS r(m, pid)
    ), now_ AS (
        SELECT s.merchant_id, s.product_id, sum(s.available)::bigint AS available, sum(s.reserved)::bigint AS reserved,
               sum(s.delivered)::bigint AS delivered, sum(s.quarantined)::bigint AS quarantined,
               sum(s.revoked)::bigint AS revoked
          FROM product_stock s JOIN changed c ON c.merchant_id = s.merchant_id AND c.product_id = s.product_id
         GROUP BY s.merchant_id, s.product_id
    ), d AS (
        SELECT n.*, t.product_id IS NULL AS missing,
               n.available - coalesce(t.available, 0) AS d_available, n.reserved - coalesce(t.reserved, 0) AS d_reserved,
               n.delivered - coalesce(t.delivered, 0) AS d_delivered,
               n.quarantined - coalesce(t.quarantined, 0) AS d_quarantined,
               n.revoked - coalesce(t.revoked, 0) AS d_revoked
          FROM now_ n LEFT JOIN stock_summary t ON t.merchant_id = n.merchant_id AND t.product_id = n.product_id
    ), written AS (
        INSERT INTO stock_summary AS t (merchant_id, product_id, available, reserved, delivered, quarantined, revoked)
        SELECT merchant_id, product_id, available, reserved, delivered, quarantined, revoked FROM d
         WHERE missing OR (d_available, d_reserved, d_delivered, d_quarantined, d_revoked) <> (0, 0, 0, 0, 0)
        ON CONFLICT (merchant_id, product_id) DO UPDATE
           SET available = excluded.available, reserved = excluded.reserved, delivered = excluded.delivered,
               quarantined = excluded.quarantined, revoked = excluded.revoked
        RETURNING 1
    ), totals AS (
        UPDATE stock_totals
           SET available = available + x.a, reserved = reserved + x.r, delivered = delivered + x.d,
               quarantined = quarantined + x.q, revoked = revoked + x.v
          FROM (SELECT sum(d_available) AS a, sum(d_reserved) AS r, sum(d_delivered) AS d, sum(d_quarantined) AS q,
                       sum(d_revoked) AS v FROM d) x
         WHERE (x.a, x.r, x.d, x.q, x.v) <> (0, 0, 0, 0, 0)
        RETURNING 1
    )
    SELECT count(*) INTO summarised FROM changed;
    -- The flags that disagree with the sums (what a race on the fast path leaves), re-decided under
    -- each product's lock, in product id order.
    FOR p IN SELECT pr.merchant_id, pr.id FROM products pr
               JOIN stock_summary t ON t.merchant_id = pr.merchant_id AND t.product_id = pr.id
              WHERE pr.id = ANY(read_p) AND pr.stock_low <> (t.available <= pr.low_stock_threshold)
              ORDER BY pr.id LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.id::text, 0));
        PERFORM codepool_check_stock(p.merchant_id, p.id);
        redecided := redecided + 1;
    END LOOP;
    -- Clean: each row read whose version is still the one read and that no one holds.
    UPDATE product_stock s SET dirty = false
      FROM (SELECT c.merchant_id, c.product_id, c.slot FROM product_stock c
             JOIN unnest(read_m, read_p, read_s, read_x) AS r(m, pid, slot, x)
               ON c.merchant_id = r.m AND c.product_id = r.pid AND c.slot = r.slot AND c.xmin = r.x
             WHERE c.dirty
             FOR UPDATE OF c SKIP LOCKED) unchanged
     WHERE s.merchant_id = unchanged.merchant_id AND s.product_id = unchanged.product_id AND s.slot = unchanged.slot;
END $$;
