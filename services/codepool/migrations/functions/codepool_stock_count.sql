-- Keeps the stock counters (product_stock: available, reserved, delivered, quarantined, revoked) for
-- the codes one statement inserted, changed the status
-- of, or deleted, then hands the products whose available stock changed to the `stock.low`
-- decision (codepool_stock_changed). Called once per statement by the statement-level triggers
-- codes_stock_after_*, with the change already grouped: for each merchant, product, slot
-- (codepool_stock_slot) and status, how many codes entered (positive) or left (negative) it.
--
-- One row update per product and slot, whatever the number of codes. Rows are updated in
-- (product, slot) order, so two statements never wait on each other's counter rows in a cycle. A
-- slot's first codes create its row (an import); a code can only change or leave after it was
-- counted, so a missing row with a negative change fails the row's CHECK instead of being lost.
-- Each row it changes is marked changed (dirty, a new row is born so) for the next stock round
-- (codepool_stock_round: the gauge's summary and the low-stock repair), in the same row update.
CREATE OR REPLACE FUNCTION codepool_stock_count(p_merchant_ids text[], p_product_ids uuid[], p_slots smallint[],
                                                p_statuses text[], p_codes bigint[])
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d record;
    changed jsonb := '[]';
BEGIN
    FOR d IN SELECT x.m, x.p, x.s,
                    coalesce(sum(x.n) FILTER (WHERE x.status = 'available'), 0) AS available,
                    coalesce(sum(x.n) FILTER (WHERE x.status = 'reserved'), 0) AS reserved,
                    coalesce(sum(x.n) FILTER (WHERE x.status = 'delivered'), 0) AS delivered,
                    coalesce(sum(x.n) FILTER (WHERE x.status = 'quarantined'), 0) AS quarantined,
                    coalesce(sum(x.n) FILTER (WHERE x.status = 'revoked'), 0) AS revoked
             FROM unnest(p_merchant_ids, p_product_ids, p_slots, p_statuses, p_codes) AS x(m, p, s, status, n)
             GROUP BY 1, 2, 3
             ORDER BY 2, 3 LOOP
        CONTINUE WHEN d.available = 0 AND d.reserved = 0 AND d.delivered = 0 AND d.quarantined = 0 AND d.revoked = 0;
        UPDATE product_stock
           SET available = available + d.available, reserved = reserved + d.reserved, delivered = delivered + d.delivered,
               quarantined = quarantined + d.quarantined, revoked = revoked + d.revoked, dirty = true
         WHERE merchant_id = d.m AND product_id = d.p AND slot = d.s;
        IF NOT FOUND THEN
            INSERT INTO product_stock AS t (merchant_id, product_id, slot, available, reserved, delivered, quarantined,
                                            revoked)
            VALUES (d.m, d.p, d.s, d.available, d.reserved, d.delivered, d.quarantined, d.revoked)
            ON CONFLICT (merchant_id, product_id, slot) DO UPDATE
               SET available = t.available + excluded.available, reserved = t.reserved + excluded.reserved,
                   delivered = t.delivered + excluded.delivered, quarantined = t.quarantined + excluded.quarantined,
                   revoked = t.revoked + excluded.revoked, dirty = true;
        END IF;
        IF d.available <> 0 THEN
            changed := changed || jsonb_build_object('m', d.m, 'p', d.p);
        END IF;
    END LOOP;
    IF changed <> '[]' THEN
        PERFORM codepool_stock_changed(changed);
    END IF;
END $$;
