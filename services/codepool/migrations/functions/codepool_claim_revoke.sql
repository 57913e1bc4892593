-- Takes a claimed code back from its order (a replacement or a refund): its delivery and the code
-- become revoked, which is final (codes_guard_update, deliveries_transition). The delivery leaves
-- deliveries_one_active_per_code, so the buyer's codes no longer show it. Raises when the code is no
-- longer delivered to the order (CP013): nothing is taken back twice.
CREATE OR REPLACE FUNCTION codepool_claim_revoke(p_merchant_id text, p_product_id uuid, p_order_id text,
                                                 p_code_id uuid) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE deliveries SET status = 'revoked', revoked_at = clock_timestamp()
     WHERE merchant_id = p_merchant_id AND order_id = p_order_id AND code_id = p_code_id AND status = 'delivered';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'code % is not delivered to order %', p_code_id, p_order_id USING ERRCODE = 'CP013';
    END IF;
    UPDATE codes SET status = 'revoked'
     WHERE merchant_id = p_merchant_id AND product_id = p_product_id AND id = p_code_id AND status = 'delivered';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'code % is not delivered', p_code_id USING ERRCODE = 'CP013';
    END IF;
END $$;
