-- One merchant cannot stall every merchant's webhooks (docs/webhooks-out.md, "Fair delivery").
--
-- The state every delivery worker must agree on lives on the endpoint row, so all replicas see one
-- answer:
--   consecutive_failures  attempts in a row that did not end in a 2xx (0 after any success).
--   circuit_open_until    the circuit breaker: while it is in the future no delivery of the endpoint
--                         is claimed; once it has passed, and consecutive_failures is still at or over
--                         the threshold, the endpoint is half-open: one delivery at a time (the
--                         probe) until one succeeds (closed) or fails (open again, for longer).
--   last_claimed_at       when a worker last claimed a delivery of the endpoint: the claim serves the
--                         merchants, and a merchant's endpoints, that waited longest first.
--   redeliver_window_start, redeliver_count
--                         the manual redeliveries of the current minute, counted by the statement
--                         that queues one (a fixed window per endpoint; RESOURCE_EXHAUSTED past it).
-- How many deliveries of an endpoint or a merchant are in flight is not a stored counter (a worker
-- that dies would leave it wrong): it is the number of live leases, counted by the claim while it
-- holds the merchant's claim lock (payments/outbound/repository.py, CLAIM_*).

ALTER TABLE webhook_endpoints
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    ADD COLUMN circuit_open_until timestamptz,
    ADD COLUMN last_claimed_at timestamptz,
    ADD COLUMN redeliver_window_start timestamptz,
    ADD COLUMN redeliver_count integer NOT NULL DEFAULT 0 CHECK (redeliver_count BETWEEN 0 AND 10000);

-- The claim's two look-ups per endpoint: its due deliveries in order, and its live leases.
CREATE INDEX webhook_deliveries_due_per_endpoint ON webhook_deliveries (merchant_id, endpoint_id, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (merchant_id, endpoint_id)
    WHERE lease_owner IS NOT NULL;
