-- Starts a request's use of its Idempotency-Key (docs/checkout.md, "Idempotency-Key";
-- payments/checkout/idempotency.py BEGIN): the key's row is inserted `in_flight`, or an in-flight
-- row whose request died (locked_until passed) is taken over by a retry of the same request.
-- Returns the use (its checkout, whether it resumes an earlier run, its created_at: the row's
-- partition key, which every later statement of the request names), or no row when the key
-- belongs to a live request or already has an answer (the caller then reads it to say which).
--
-- checkout_idempotency_keys is partitioned by day (migration 0190), so its primary key holds
-- created_at and cannot say "one live use per key" across partitions. This function does: it takes
-- the key's advisory lock (held until the calling statement commits; other keys never wait) and
-- then, with a fresh snapshot (a VOLATILE function's statements each take one), looks for the
-- key's unexpired row in any partition before inserting. A key whose row expired
-- (CUTY_IDEMPOTENCY_TTL_SECONDS) is a new request: a new row, in today's partition.
CREATE OR REPLACE FUNCTION checkout_key_begin(p_customer text, p_operation text, p_key text, p_hash bytea,
                                              p_resource uuid, p_lease_seconds float8, p_ttl_seconds float8)
RETURNS TABLE (key_resource_id uuid, key_resumed boolean, key_created_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    live record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'checkout.key:' || p_operation || ':' || p_customer || ':' || p_key, 0));
    -- The key's live row, in whichever partition (one probe of each partition's primary key).
    SELECT k.created_at, k.state, k.locked_until, k.request_hash INTO live
      FROM checkout_idempotency_keys k
     WHERE k.customer_id = p_customer AND k.operation = p_operation AND k.key = p_key
       AND k.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN QUERY
        INSERT INTO checkout_idempotency_keys AS k
            (customer_id, operation, key, request_hash, resource_id, state, locked_until, expires_at)
        VALUES (p_customer, p_operation, p_key, p_hash, p_resource, 'in_flight',
                clock_timestamp() + make_interval(secs => p_lease_seconds),
                clock_timestamp() + make_interval(secs => p_ttl_seconds))
        RETURNING k.resource_id, false, k.created_at;
        RETURN;
    END IF;
    -- The live row of a request that died, retried with the same request: taken over (named whole,
    -- so only its partition is touched). Any other live row (a running request's, an answered
    -- one's) returns nothing.
    IF live.state = 'in_flight' AND live.locked_until <= clock_timestamp() AND live.request_hash = p_hash THEN
        RETURN QUERY
        UPDATE checkout_idempotency_keys k SET
            state = 'in_flight', response = NULL, response_is_error = NULL,
            locked_until = clock_timestamp() + make_interval(secs => p_lease_seconds), runs = k.runs + 1
        WHERE k.customer_id = p_customer AND k.operation = p_operation AND k.key = p_key
          AND k.created_at = live.created_at AND k.state = 'in_flight' AND k.locked_until <= clock_timestamp()
        RETURNING k.resource_id, true, k.created_at;
    END IF;
END
$$;
