-- The role the webhook delivery process (`python -m payments webhooks-out`) connects as
-- (docs/security.md, "Database roles"). A merchant's endpoint is untrusted, so whatever it still
-- manages against that process stops at deliveries: the role reads and moves deliveries, reads
-- the events and endpoints they belong to, records attempts and the endpoint's circuit, and sees
-- which migrations are applied (it waits for them). Nothing on checkouts, payments, refunds, PSP
-- events or the idempotency keys; no endpoint created, deleted or re-pointed (UPDATE only of the
-- columns delivery moves); no default privileges, so a later table is granted here by name or
-- not at all. Row-Level Security binds it as every role: its sessions say `*` (every merchant's
-- deliveries are its work), set by its pool. Created without LOGIN only where the migrating role
-- may create roles and it does not exist yet (cutylib.db.ensure_service_role makes it a login role
-- with its statement timeout in the tests and `make run`; CloudNativePG's managed roles in Kubernetes).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'payments_webhooks_out') THEN
        CREATE ROLE payments_webhooks_out NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO payments_webhooks_out;
GRANT SELECT ON schema_migrations, merchant_events TO payments_webhooks_out;
GRANT SELECT ON webhook_deliveries, webhook_endpoints TO payments_webhooks_out;
GRANT UPDATE (state, attempts, next_attempt_at, lease_owner, lease_until, delivered_at)
    ON webhook_deliveries TO payments_webhooks_out;
GRANT UPDATE (last_claimed_at, consecutive_failures, circuit_open_until)
    ON webhook_endpoints TO payments_webhooks_out;
GRANT INSERT ON webhook_attempts TO payments_webhooks_out;
