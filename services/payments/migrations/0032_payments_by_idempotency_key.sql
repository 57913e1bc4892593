-- A PSP webhook finds its payment by id, intent id or payment attempt id
-- (webhooks.RESOLVE_AND_STORE: `id = $1 OR psp_intent_id = $2 OR idempotency_key = $3`). The attempt
-- id's only index led with merchant_id, which a webhook does not know, so the OR read the whole
-- payments table for every webhook: 366 ms a webhook on 500,000 payments against 2.8 ms on an empty
-- table (`make bench-growth`, docs/benchmarks.md). Its own index makes the OR three index probes.
CREATE INDEX payments_by_idempotency_key ON payments (idempotency_key);
