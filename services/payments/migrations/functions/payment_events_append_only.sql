-- An append-only table (payment_events, the timeline; merchant_events, the outbox; operator_reads,
-- the operator's read log): a row is history, never changed, never deleted.
CREATE OR REPLACE FUNCTION payment_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payment_events is append-only' USING ERRCODE = 'insufficient_privilege';
END $$;
