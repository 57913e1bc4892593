-- Resolves an open claim by replacement (docs/codepool.md, "Claims"), decided by the database in one
-- transaction: the claim row locked; the order's reservation row locked (every writer of an order
-- locks it first, then codes); the next available code of the same product taken with
-- `FOR UPDATE SKIP LOCKED` (another batch than the claimed code's first, else the same batch:
-- quarantined batches have no available codes), reserved and delivered to the order as a delivery
-- of its own; the claimed code and its delivery revoked; the claim `replaced`, naming the
-- new code; audited and the merchant's `code.replaced` written. So a retry, a concurrent second
-- resolution or a crash at any point delivers at most one replacement: a replayed call finds the
-- claim replaced and returns it; another claim state raises CP011; no code available raises CP012
-- (the claim stays open). p_merchant_id: the resolving admin's merchant, NULL for any (system).
-- Cost: the pick walks codes_available in `seq` order past the claimed batch's own available codes.
CREATE OR REPLACE FUNCTION codepool_claim_replace(p_claim_id uuid, p_merchant_id text, p_actor text, p_note text)
RETURNS code_claims LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c code_claims;
    r reservations;
    new_code uuid;
    n bigint;
BEGIN
    SELECT * INTO c FROM code_claims
     WHERE id = p_claim_id AND (p_merchant_id IS NULL OR merchant_id = p_merchant_id) FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF c.status = 'replaced' THEN
        RETURN c;
    END IF;
    IF c.status <> 'open' THEN
        RAISE EXCEPTION 'claim % is %, not open', c.id, c.status USING ERRCODE = 'CP011';
    END IF;
    SELECT * INTO r FROM reservations WHERE order_id = c.order_id FOR UPDATE;
    SELECT id INTO new_code FROM codes
     WHERE merchant_id = c.merchant_id AND product_id = c.product_id AND status = 'available' AND batch_id <> c.batch_id
     ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF new_code IS NULL THEN
        SELECT id INTO new_code FROM codes
         WHERE merchant_id = c.merchant_id AND product_id = c.product_id AND status = 'available'
         ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED;
    END IF;
    IF new_code IS NULL THEN
        RAISE EXCEPTION 'no code of product % is available to replace code %', c.product_id, c.code_id
            USING ERRCODE = 'CP012';
    END IF;
    UPDATE deliveries SET status = 'revoked', revoked_at = clock_timestamp()
     WHERE merchant_id = c.merchant_id AND order_id = c.order_id AND code_id = c.code_id AND status = 'delivered';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'code % is not delivered to order %', c.code_id, c.order_id USING ERRCODE = 'CP013';
    END IF;
    -- Both codes in one statement: the stock counters' rows are then locked once, in (product, slot)
    -- order (codepool_stock_count), so two replacements never wait on each other's rows in a cycle;
    -- the delivery below touches only rows this statement holds already.
    UPDATE codes SET status = CASE WHEN id = new_code THEN 'reserved' ELSE 'revoked' END
     WHERE merchant_id = c.merchant_id AND product_id = c.product_id
       AND ((id = new_code AND status = 'available') OR (id = c.code_id AND status = 'delivered'));
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> 2 THEN
        RAISE EXCEPTION 'claim %: replacing code % changed % codes', c.id, c.code_id, n USING ERRCODE = 'CP013';
    END IF;
    UPDATE codes SET status = 'delivered' WHERE id = new_code;
    INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status, delivered_at)
    VALUES (c.merchant_id, c.order_id, r.order_item_id, c.product_id, r.customer_id, new_code, 'delivered',
            clock_timestamp());
    UPDATE code_claims SET status = 'replaced', replacement_code_id = new_code, resolved_by = p_actor,
                           resolved_at = clock_timestamp(), resolution_note = p_note
     WHERE id = c.id
    RETURNING * INTO c;
    INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
    VALUES (c.merchant_id, p_actor, 'claim_replace', c.product_id, c.order_id, ARRAY[c.code_id, new_code],
            jsonb_build_object('claim_id', c.id, 'revoked_code_id', c.code_id, 'replacement_code_id', new_code));
    PERFORM codepool_emit_event(c.merchant_id, c.product_id, 'code.replaced', c.order_id,
                                jsonb_build_object('claim', codepool_claim_json(c)));
    RETURN c;
END $$;
