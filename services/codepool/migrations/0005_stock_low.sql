-- Issue 12, item 6: the `stock.low` outbound event (docs/codepool.md "Low stock",
-- docs/webhooks-out.md). The code pool owns stock, so it owns the event: a transactional outbox
-- (stock_events) written by the statement that changes a product's available stock, read by the
-- orchestrator through ListStockEvents and relayed into its merchant events.
--
-- When is stock low: a product's available codes are at or below its low_stock_threshold. The event
-- is written on the crossing only: products.stock_low is the product's "announced" flag. A drop to
-- or below the threshold sets it and writes the event (once); a rise above it (an import, a release,
-- an expiry) clears it, which re-arms the event. A new product has no
-- stock, so it starts low (no event until it has been stocked above its threshold once).

ALTER TABLE products ADD COLUMN low_stock_threshold integer NOT NULL DEFAULT 10
    CONSTRAINT products_low_stock_threshold_range CHECK (low_stock_threshold BETWEEN 0 AND 1000000);
ALTER TABLE products ADD COLUMN stock_low boolean NOT NULL DEFAULT true;

-- Products that exist already: their flag is their stock now (no event for the past).
UPDATE products p SET stock_low = (
    SELECT count(*) FROM (SELECT 1 FROM codes c
                          WHERE c.merchant_id = p.merchant_id AND c.product_id = p.id AND c.status = 'available'
                          LIMIT p.low_stock_threshold + 1) s) <= p.low_stock_threshold;

-- The outbox. `seq` is the feed's cursor (ListStockEvents(after_seq)): an event is inserted only
-- while its transaction holds the advisory lock 'codepool.stock_events' (codepool_check_stock), taken
-- before the identity's nextval and held until commit, so events become visible in seq order and a
-- reader that has seen seq n never later finds a committed event below n. Events are rare (one per
-- crossing), so that lock costs nothing the hot path notices.
CREATE TABLE stock_events (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    merchant_id text NOT NULL,
    id          uuid NOT NULL,
    product_id  uuid NOT NULL,
    type        text NOT NULL CHECK (type IN ('stock.low')),
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (merchant_id, id),
    FOREIGN KEY (merchant_id, product_id) REFERENCES products (merchant_id, id)
);
CREATE INDEX stock_events_product ON stock_events (merchant_id, product_id, seq);

CREATE TRIGGER stock_events_append_only BEFORE UPDATE OR DELETE ON stock_events FOR EACH ROW
    EXECUTE FUNCTION refuse_change('stock events are history');

-- Re-decide one product's flag from its stock as committed plus this transaction's own changes.
-- The caller holds the product's advisory lock (codepool_lock_stock), taken after its change and held
-- until commit, so the deciders of one product run one at a time, and each statement below (a fresh
-- snapshot: VOLATILE plpgsql in READ COMMITTED) sees what every earlier decider committed. Two
-- reservations that cross the threshold together therefore write one event: the second sees the
-- first's codes gone and the flag set. The count stops at threshold + 1 (codes_available, a few pages).
CREATE FUNCTION codepool_check_stock(p_merchant_id text, p_product_id uuid) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    prod      record;
    available bigint;
    ev_id     uuid;
    ev_at     timestamptz;
BEGIN
    SELECT id, merchant_id, sku, name, low_stock_threshold, stock_low INTO prod
      FROM products WHERE merchant_id = p_merchant_id AND id = p_product_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO available FROM (
        SELECT 1 FROM codes c
        WHERE c.merchant_id = p_merchant_id AND c.product_id = p_product_id AND c.status = 'available'
        LIMIT prod.low_stock_threshold + 1) s;
    IF available > prod.low_stock_threshold THEN
        -- replenished: re-arm
        UPDATE products SET stock_low = false WHERE merchant_id = p_merchant_id AND id = p_product_id AND stock_low;
        RETURN;
    END IF;
    -- at or below: announce on the crossing only (the flag was clear)
    UPDATE products SET stock_low = true WHERE merchant_id = p_merchant_id AND id = p_product_id AND NOT stock_low;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock_events', 0));
    ev_id := gen_random_uuid();
    ev_at := clock_timestamp();
    INSERT INTO stock_events (merchant_id, id, product_id, type, payload, created_at)
    VALUES (p_merchant_id, ev_id, p_product_id, 'stock.low', jsonb_build_object(
        'id', ev_id,
        'type', 'stock.low',
        'created', to_char(ev_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'merchant_id', p_merchant_id,
        'data', jsonb_build_object('product', jsonb_build_object(
            'id', p_product_id,
            'sku', prod.sku,
            'name', prod.name,
            'available', available,
            'low_stock_threshold', prod.low_stock_threshold))),
        ev_at);
    -- Wakes the orchestrator's relay at commit (it polls as well).
    PERFORM pg_notify('cuty_stock_events', p_merchant_id);
END $$;

-- The products a statement changed the available stock of, re-decided: every product's lock first
-- (in product id order, so two statements never wait on each other in a cycle), then each product.
-- The events' lock ('codepool.stock_events') is only ever taken after all of them.
CREATE FUNCTION codepool_stock_changed(p_changed jsonb) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT DISTINCT x->>'m' AS merchant_id, (x->>'p')::uuid AS product_id
             FROM jsonb_array_elements(p_changed) x ORDER BY 2 LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('codepool.stock:' || p.product_id::text, 0));
    END LOOP;
    FOR p IN SELECT DISTINCT x->>'m' AS merchant_id, (x->>'p')::uuid AS product_id
             FROM jsonb_array_elements(p_changed) x ORDER BY 2 LOOP
        PERFORM codepool_check_stock(p.merchant_id, p.product_id);
    END LOOP;
END $$;

-- Every statement that makes codes available or takes them (import, reserve, a late delivery's
-- re-take, release, expiry, and any hand-written SQL) fires one of these: the event is written by the
-- statement that makes the change, whatever code ran it. Delivery (reserved -> delivered) and key
-- rotation do not change the available stock and decide nothing.
CREATE FUNCTION codes_stock_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed jsonb;
BEGIN
    SELECT jsonb_agg(DISTINCT jsonb_build_object('m', n.merchant_id, 'p', n.product_id)) INTO changed
      FROM new_codes n WHERE n.status = 'available';
    IF changed IS NOT NULL THEN
        PERFORM codepool_stock_changed(changed);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION codes_stock_after_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed jsonb;
BEGIN
    SELECT jsonb_agg(DISTINCT jsonb_build_object('m', n.merchant_id, 'p', n.product_id)) INTO changed
      FROM new_codes n JOIN old_codes o ON o.id = n.id
     WHERE (n.status = 'available') <> (o.status = 'available');
    IF changed IS NOT NULL THEN
        PERFORM codepool_stock_changed(changed);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION codes_stock_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed jsonb;
BEGIN
    SELECT jsonb_agg(DISTINCT jsonb_build_object('m', o.merchant_id, 'p', o.product_id)) INTO changed
      FROM old_codes o WHERE o.status = 'available';
    IF changed IS NOT NULL THEN
        PERFORM codepool_stock_changed(changed);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER codes_stock_after_insert AFTER INSERT ON codes REFERENCING NEW TABLE AS new_codes
    FOR EACH STATEMENT EXECUTE FUNCTION codes_stock_after_insert();
CREATE TRIGGER codes_stock_after_update AFTER UPDATE ON codes REFERENCING OLD TABLE AS old_codes NEW TABLE AS new_codes
    FOR EACH STATEMENT EXECUTE FUNCTION codes_stock_after_update();
CREATE TRIGGER codes_stock_after_delete AFTER DELETE ON codes REFERENCING OLD TABLE AS old_codes
    FOR EACH STATEMENT EXECUTE FUNCTION codes_stock_after_delete();

SELECT cuty_tenant_table('stock_events');
