-- The other steps of a claim's resolution (docs/codepool.md, "Claims"), each one conditional
-- statement on the locked claim row, audited, in one transaction:
--   reject:   open -> rejected (with the admin's note); the merchant's `code.claim_rejected`;
--   refund:   open -> refunding: the refund is decided (one code's price, from the reservation), so
--             no other resolution can follow; the orchestrator then refunds through its refund
--             machinery under a key derived from the claim;
--   refunded: refunding -> refunded (the PSP refund's id), the code revoked; `code.claim_refunded`;
--   reopen:   refunding -> open (the refund was refused; nothing was given back).
-- A step repeated after it succeeded returns the claim as it is (a replay); a step the claim's
-- status does not allow raises CP011. p_merchant_id: the admin's merchant, NULL for any (system).
CREATE OR REPLACE FUNCTION codepool_claim_settle(p_claim_id uuid, p_merchant_id text, p_step text, p_actor text,
                                                 p_note text, p_refund_id text) RETURNS code_claims
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c code_claims;
    price bigint;
    cur text;
BEGIN
    SELECT * INTO c FROM code_claims
     WHERE id = p_claim_id AND (p_merchant_id IS NULL OR merchant_id = p_merchant_id) FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF (p_step = 'reject' AND c.status = 'rejected') OR (p_step = 'refund' AND c.status IN ('refunding', 'refunded'))
       OR (p_step = 'refunded' AND c.status = 'refunded') OR (p_step = 'reopen' AND c.status = 'open') THEN
        RETURN c;
    END IF;
    IF NOT ((p_step IN ('reject', 'refund') AND c.status = 'open')
            OR (p_step IN ('refunded', 'reopen') AND c.status = 'refunding')) THEN
        RAISE EXCEPTION 'claim % is %: cannot %', c.id, c.status, p_step USING ERRCODE = 'CP011';
    END IF;
    IF p_step = 'reject' THEN
        UPDATE code_claims SET status = 'rejected', resolved_by = p_actor, resolved_at = clock_timestamp(),
                               resolution_note = p_note
         WHERE id = c.id RETURNING * INTO c;
        INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
        VALUES (c.merchant_id, p_actor, 'claim_reject', c.product_id, c.order_id, ARRAY[c.code_id],
                jsonb_build_object('claim_id', c.id, 'note', p_note));
        PERFORM codepool_emit_event(c.merchant_id, c.product_id, 'code.claim_rejected', c.order_id,
                                    jsonb_build_object('claim', codepool_claim_json(c)));
    ELSIF p_step = 'refund' THEN
        SELECT r.unit_price_minor, r.currency INTO price, cur FROM reservations r
         WHERE r.merchant_id = c.merchant_id AND r.order_id = c.order_id;
        UPDATE code_claims SET status = 'refunding', resolved_by = p_actor, resolution_note = p_note,
                               refund_minor = price, currency = cur, refund_attempt = refund_attempt + 1
         WHERE id = c.id RETURNING * INTO c;
        INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
        VALUES (c.merchant_id, p_actor, 'claim_refund', c.product_id, c.order_id, ARRAY[c.code_id],
                jsonb_build_object('claim_id', c.id, 'note', p_note, 'refund_minor', price, 'currency', cur));
    ELSIF p_step = 'refunded' THEN
        PERFORM codepool_claim_revoke(c.merchant_id, c.product_id, c.order_id, c.code_id);
        UPDATE code_claims SET status = 'refunded', refund_id = p_refund_id, resolved_at = clock_timestamp()
         WHERE id = c.id RETURNING * INTO c;
        INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
        VALUES (c.merchant_id, p_actor, 'claim_refunded', c.product_id, c.order_id, ARRAY[c.code_id],
                jsonb_build_object('claim_id', c.id, 'refund_id', p_refund_id));
        PERFORM codepool_emit_event(c.merchant_id, c.product_id, 'code.claim_refunded', c.order_id,
                                    jsonb_build_object('claim', codepool_claim_json(c)));
    ELSE
        UPDATE code_claims SET status = 'open', resolved_by = NULL, refund_minor = NULL, currency = NULL
         WHERE id = c.id RETURNING * INTO c;
        INSERT INTO audit_log (merchant_id, actor, action, product_id, order_id, code_ids, details)
        VALUES (c.merchant_id, p_actor, 'claim_reopen', c.product_id, c.order_id, ARRAY[c.code_id],
                jsonb_build_object('claim_id', c.id, 'note', p_note));
    END IF;
    RETURN c;
END $$;
