-- Holds a supplier batch back (docs/codepool.md, "Batch quarantine"): the batch becomes
-- quarantined and its available codes quarantined in one statement, under the batch's exclusive
-- advisory lock ('codepool.batch:' || id): a release of one of its reserved codes (codes_guard_update
-- takes the shared lock) waits for this transaction, then sees the batch quarantined and quarantines
-- its code instead of selling it again. Reserved codes stay reserved: a reservation made before is
-- honoured when paid. Audited, and the merchant's `batch.quarantined` event written, in the same
-- transaction. Returns how many codes were quarantined, or NULL when the batch was not active.
CREATE OR REPLACE FUNCTION codepool_batch_quarantine(p_merchant_id text, p_product_id uuid, p_batch_id uuid,
                                                     p_actor text, p_cause jsonb) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ref text;
    n   bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('codepool.batch:' || p_batch_id::text, 0));
    UPDATE supplier_batches SET status = 'quarantined', quarantined_at = clock_timestamp()
     WHERE merchant_id = p_merchant_id AND product_id = p_product_id AND id = p_batch_id AND status = 'active'
    RETURNING batch_ref INTO ref;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH q AS (
        UPDATE codes SET status = 'quarantined'
         WHERE merchant_id = p_merchant_id AND product_id = p_product_id AND batch_id = p_batch_id
           AND status = 'available'
        RETURNING 1)
    SELECT count(*) INTO n FROM q;
    INSERT INTO audit_log (merchant_id, actor, action, product_id, details)
    VALUES (p_merchant_id, p_actor, 'batch_quarantine', p_product_id,
            jsonb_build_object('batch_id', p_batch_id, 'batch_ref', ref, 'codes_quarantined', n) || p_cause);
    PERFORM codepool_emit_event(p_merchant_id, p_product_id, 'batch.quarantined', NULL, jsonb_build_object(
        'batch', jsonb_build_object('id', p_batch_id, 'batch_ref', ref, 'product_id', p_product_id,
                                    'codes_quarantined', n),
        'cause', p_cause));
    RETURN n;
END $$;
