-- One PSP dispute webhook (charge.dispute.created | charge.dispute.closed; docs/payments.md,
-- "Disputes"), handled in one statement: stored in psp_events (deduplicated on the PSP's event id),
-- the dispute inserted or moved forward (never back: an out-of-order `created` after `closed`
-- changes nothing), and for each change its timeline event (source 'dispute') and its merchant
-- event (`payment.disputed` when it is first known, `payment.dispute_closed` when it closes) with
-- their deliveries. So no change without its events, no event twice, whatever the retries.
-- Returns: outcome (duplicate | ignored | processed), the dispute, its status, whether it changed.
CREATE OR REPLACE FUNCTION disputes_record(p_event_id text, p_type text, p_payload jsonb, p_payment_hint uuid)
RETURNS TABLE (r_outcome text, r_dispute_id uuid, r_status text, r_changed boolean, r_was text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    obj jsonb := p_payload #> '{data,object}';
    new_status text := p_payload #>> '{data,object,status}';
    pay record;
    d disputes;
    before text;
    psp_evidence jsonb := CASE WHEN jsonb_typeof(obj->'evidence') = 'object'
                                    AND (obj #>> '{evidence_details,submitted_at}') IS NOT NULL
                               THEN obj->'evidence' END;
    psp_submitted timestamptz := CASE WHEN jsonb_typeof(obj->'evidence') = 'object'
                                      THEN to_timestamp((obj #>> '{evidence_details,submitted_at}')::float8) END;
    rank_of jsonb := '{"needs_response": 1, "under_review": 2, "won": 3, "lost": 3}';
    t text;
BEGIN
    SELECT p.id, p.merchant_id, p.checkout_id INTO pay FROM payments p
     WHERE p.psp_intent_id = obj->>'payment_intent' OR p.id = p_payment_hint
     ORDER BY (p.psp_intent_id = obj->>'payment_intent') DESC NULLS LAST LIMIT 1;
    IF NOT psp_events_store(p_event_id, p_type, pay.id, p_payload,
                            CASE WHEN pay.id IS NULL OR NOT rank_of ? coalesce(new_status, '') THEN 'ignored'
                                 ELSE 'processed' END, 0) THEN
        RETURN QUERY SELECT 'duplicate'::text, NULL::uuid, NULL::text, false, NULL::text;
        RETURN;
    END IF;
    IF pay.id IS NULL OR NOT rank_of ? coalesce(new_status, '') THEN
        RETURN QUERY SELECT 'ignored'::text, NULL::uuid, NULL::text, false, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO d FROM disputes x WHERE x.psp_dispute_id = obj->>'id' FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO disputes AS x (merchant_id, payment_id, checkout_id, psp_dispute_id, status, amount_minor, currency,
                                   reason, evidence_due_by, closed_at)
        VALUES (pay.merchant_id, pay.id, pay.checkout_id, obj->>'id', new_status, (obj->>'amount')::bigint,
                upper(obj->>'currency'), coalesce(obj->>'reason', ''),
                to_timestamp((obj #>> '{evidence_details,due_by}')::float8),
                CASE WHEN new_status IN ('won', 'lost') THEN clock_timestamp() END)
        ON CONFLICT (psp_dispute_id) DO NOTHING
        RETURNING * INTO d;
        IF NOT FOUND THEN  -- inserted meanwhile by the dispute's other event: move it forward below
            SELECT * INTO d FROM disputes x WHERE x.psp_dispute_id = obj->>'id' FOR UPDATE;
            before := d.status;
        END IF;
    ELSE
        before := d.status;
    END IF;
    IF before IS NOT NULL THEN
        IF (rank_of->>new_status)::int <= (rank_of->>before)::int THEN
            RETURN QUERY SELECT 'processed'::text, d.id, d.status, false, before;
            RETURN;
        END IF;
        -- The PSP's word on the evidence it holds, should it close the dispute before our record of
        -- the submission (a crash between the PSP's answer and the record): kept, never replaced.
        UPDATE disputes x SET status = new_status, updated_at = clock_timestamp(),
                              closed_at = CASE WHEN new_status IN ('won', 'lost') THEN clock_timestamp() END,
                              evidence = coalesce(x.evidence, psp_evidence),
                              evidence_submitted_at = coalesce(x.evidence_submitted_at, psp_submitted)
         WHERE x.merchant_id = d.merchant_id AND x.id = d.id
        RETURNING * INTO d;
    END IF;
    INSERT INTO payment_events (payment_id, checkout_id, merchant_id, source, from_status, to_status, note)
    VALUES (d.payment_id, d.checkout_id, d.merchant_id, 'dispute', CASE WHEN before IS NOT NULL THEN 'dispute.' || before END,
            'dispute.' || d.status,
            format('%s %s: %s %s minor units (%s), evidence due by %s', p_type, d.psp_dispute_id, d.amount_minor,
                   d.currency, nullif(d.reason, ''), to_char(d.evidence_due_by AT TIME ZONE 'UTC',
                                                             'YYYY-MM-DD"T"HH24:MI:SS"Z"')));
    FOREACH t IN ARRAY ARRAY[CASE WHEN before IS NULL THEN 'payment.disputed' END,
                             CASE WHEN d.status IN ('won', 'lost') THEN 'payment.dispute_closed' END] LOOP
        CONTINUE WHEN t IS NULL;
        PERFORM merchant_events_append(d.merchant_id, t, d.checkout_id, jsonb_build_object('dispute', jsonb_strip_nulls(jsonb_build_object(
                'id', d.id, 'psp_dispute_id', d.psp_dispute_id, 'payment_id', d.payment_id,
                'checkout_id', d.checkout_id, 'status', d.status, 'reason', nullif(d.reason, ''),
                'amount', jsonb_build_object('amount_minor', d.amount_minor, 'currency_code', d.currency),
                'evidence_due_by', to_char(d.evidence_due_by AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')))));
    END LOOP;
    RETURN QUERY SELECT 'processed'::text, d.id, d.status, true, before;
END $$;
