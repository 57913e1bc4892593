-- A claim as it appears in merchant events' `data.claim` (never a code value).
CREATE OR REPLACE FUNCTION codepool_claim_json(c code_claims) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'id', c.id, 'status', c.status, 'kind', c.kind, 'reason', c.reason, 'order_id', c.order_id,
        'product_id', c.product_id, 'batch_id', c.batch_id, 'code_id', c.code_id,
        'replacement_code_id', c.replacement_code_id, 'opened_by', c.opened_by, 'resolved_by', c.resolved_by,
        'resolution_note', c.resolution_note, 'refund_id', c.refund_id,
        'refund', CASE WHEN c.refund_minor IS NOT NULL
                       THEN jsonb_build_object('amount_minor', c.refund_minor, 'currency', c.currency) END))
$$;
