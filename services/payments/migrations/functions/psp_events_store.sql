-- Stores one PSP webhook event unless its id is stored already (a redelivery); true when stored
-- (payments/webhooks.py RESOLVE_AND_STORE, disputes_record). `p_status`: received (to be handled:
-- due again after `p_retry_seconds` should its handling die), processed or ignored (done now).
--
-- psp_events is partitioned by week (migration 0191), so its primary key holds received_at and
-- cannot say "one row per event id" across partitions. This function does: it takes the event id's
-- advisory lock (held until the calling statement's transaction ends; other events never wait)
-- and then, with a fresh snapshot (a VOLATILE function's statements each take one), looks for the
-- id in every partition before inserting. An id is remembered while its partition is kept
-- (CUTY_PSP_EVENT_RETENTION_DAYS); a delivery is refused long before that, once it is older than
-- the signature tolerance (5 minutes).
CREATE OR REPLACE FUNCTION psp_events_store(p_event_id text, p_type text, p_payment_id uuid, p_payload jsonb,
                                            p_status text, p_retry_seconds float8)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('psp.event:' || p_event_id, 0));
    IF EXISTS (SELECT FROM psp_events e WHERE e.event_id = p_event_id) THEN
        RETURN false;
    END IF;
    INSERT INTO psp_events (event_id, type, payment_id, payload, status, next_attempt_at, processed_at)
    VALUES (p_event_id, p_type, p_payment_id, p_payload, p_status,
            CASE WHEN p_status = 'received' THEN clock_timestamp() + make_interval(secs => p_retry_seconds) END,
            CASE WHEN p_status IN ('processed', 'ignored') THEN clock_timestamp() END);
    RETURN true;
END
$$;
