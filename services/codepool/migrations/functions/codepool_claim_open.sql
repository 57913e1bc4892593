-- Opens a claim on a delivered code of an order (docs/codepool.md, "Claims"), in one statement:
--   * a replay (the claim id, derived from the caller's Idempotency-Key, exists) returns the stored
--     claim unchanged; the caller compares it with its request;
--   * the code must be delivered to the order now (not revoked, not another order's), and, when
--     given, to that customer (a buyer) or of that merchant (staff): else no row (NOT_FOUND); the
--     order must be live (an order moved into the history, past the claims window, has no live
--     delivery);
--   * at most one unresolved claim per code: the partial unique index code_claims_one_open_per_code
--     decides; a second one raises CP010;
--   * audited (claim_open) and the merchant's `code.claimed` written in the same transaction;
--   * the batch's claims are counted under the batch's advisory lock, so two claims opening together
--     count each other: the one that reaches the product's claim_quarantine_threshold quarantines
--     the batch (codepool_batch_quarantine), in its own transaction.
CREATE OR REPLACE FUNCTION codepool_claim_open(p_claim_id uuid, p_order_id text, p_code_id uuid, p_customer_id text,
                                               p_merchant_id text, p_kind text, p_reason text, p_actor text)
RETURNS code_claims LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c code_claims;
    d record;
    threshold integer;
    n bigint;
BEGIN
    SELECT * INTO c FROM code_claims WHERE id = p_claim_id;
    IF FOUND THEN
        RETURN c;
    END IF;
    SELECT dl.merchant_id, dl.product_id, dl.customer_id, co.batch_id INTO d
      FROM reservations r
      JOIN deliveries dl ON dl.merchant_id = r.merchant_id AND dl.order_id = r.order_id
      JOIN codes co ON co.merchant_id = dl.merchant_id AND co.product_id = dl.product_id AND co.id = dl.code_id
     WHERE r.order_id = p_order_id AND dl.code_id = p_code_id AND dl.status = 'delivered'
       AND (p_customer_id IS NULL OR r.customer_id = p_customer_id)
       AND (p_merchant_id IS NULL OR r.merchant_id = p_merchant_id)
       -- the order stays live until the claim commits: the mover skips a reservation held key-share,
       -- and an order the mover took meanwhile is gone when the lock is granted (no row: NOT_FOUND)
       FOR KEY SHARE OF r;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('codepool.batch:' || d.batch_id::text, 0));
    INSERT INTO code_claims (id, merchant_id, product_id, batch_id, code_id, order_id, customer_id, kind, reason,
                             opened_by)
    VALUES (p_claim_id, d.merchant_id, d.product_id, d.batch_id, p_code_id, p_order_id, d.customer_id, p_kind,
            p_reason, p_actor)
    ON CONFLICT DO NOTHING
    RETURNING * INTO c;
    IF NOT FOUND THEN
        SELECT * INTO c FROM code_claims WHERE id = p_claim_id;
        IF FOUND THEN
            RETURN c;  -- the same claim, opened meanwhile by a concurrent replay
        END IF;
        RAISE EXCEPTION 'code % has an unresolved claim', p_code_id USING ERRCODE = 'CP010';
    END IF;
    INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
    VALUES (c.merchant_id, p_actor, 'claim_open', c.product_id, c.order_id, ARRAY[c.code_id],
            jsonb_build_object('claim_id', c.id, 'kind', c.kind, 'batch_id', c.batch_id));
    SELECT p.claim_quarantine_threshold INTO threshold FROM products p
     WHERE p.merchant_id = c.merchant_id AND p.id = c.product_id;
    IF threshold IS NOT NULL THEN
        -- open or upheld claims on the batch since it was last released
        SELECT count(*) INTO n FROM code_claims k
          JOIN supplier_batches b ON b.merchant_id = k.merchant_id AND b.product_id = k.product_id AND b.id = k.batch_id
         WHERE k.merchant_id = c.merchant_id AND k.product_id = c.product_id AND k.batch_id = c.batch_id
           AND k.status <> 'rejected' AND k.opened_at > coalesce(b.released_at, '-infinity');
        IF n >= threshold THEN
            PERFORM codepool_batch_quarantine(c.merchant_id, c.product_id, c.batch_id, 'system:claims',
                                              jsonb_build_object('claims', n, 'threshold', threshold,
                                                                 'claim_id', c.id));
        END IF;
    END IF;
    -- The event last: the outbox's lock ('codepool.stock_events') is taken after every row this
    -- transaction changes (the quarantine's codes and stock counters), as everywhere, so a claim that
    -- quarantines and a replacement of the same product never wait on each other in a cycle.
    PERFORM codepool_emit_event(c.merchant_id, c.product_id, 'code.claimed', c.order_id,
                                jsonb_build_object('claim', codepool_claim_json(c)));
    RETURN c;
END $$;
