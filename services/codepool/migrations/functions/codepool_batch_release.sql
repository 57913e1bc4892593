-- An admin's decision on a quarantined batch (docs/codepool.md, "Batch quarantine"), under the
-- batch's exclusive advisory lock, in one transaction:
--   release: the batch sells again, its quarantined codes available again; its claims so far no
--            longer count towards the threshold (released_at);
--   retire:  the batch is gone for good, its quarantined codes revoked (final); a code reserved
--            now and released later is revoked then (codes_guard_update).
-- Returns how many codes moved, or NULL when the batch is not quarantined (or not the merchant's).
CREATE OR REPLACE FUNCTION codepool_batch_release(p_merchant_id text, p_product_id uuid, p_batch_id uuid,
                                                  p_step text, p_actor text, p_note text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    b supplier_batches;
    n bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('codepool.batch:' || p_batch_id::text, 0));
    IF p_step = 'release' THEN
        UPDATE supplier_batches SET status = 'active', released_at = clock_timestamp()
         WHERE id = p_batch_id AND product_id = p_product_id AND (p_merchant_id IS NULL OR merchant_id = p_merchant_id)
           AND status = 'quarantined'
        RETURNING * INTO b;
    ELSE
        UPDATE supplier_batches SET status = 'retired', retired_at = clock_timestamp()
         WHERE id = p_batch_id AND product_id = p_product_id AND (p_merchant_id IS NULL OR merchant_id = p_merchant_id)
           AND status = 'quarantined'
        RETURNING * INTO b;
    END IF;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH m AS (
        UPDATE codes SET status = CASE p_step WHEN 'release' THEN 'available' ELSE 'revoked' END
         WHERE merchant_id = b.merchant_id AND product_id = b.product_id AND batch_id = b.id AND status = 'quarantined'
        RETURNING 1)
    SELECT count(*) INTO n FROM m;
    INSERT INTO audit_log (merchant_id, actor, action, product_id, details)
    VALUES (b.merchant_id, p_actor, CASE p_step WHEN 'release' THEN 'batch_release' ELSE 'batch_retire' END,
            b.product_id, jsonb_build_object('batch_id', b.id, 'batch_ref', b.batch_ref, 'codes', n, 'note', p_note));
    RETURN n;
END $$;
