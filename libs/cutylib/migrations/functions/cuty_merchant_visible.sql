-- Merchants as tenants (docs/tenancy.md): a function every service database shares; cutylib.db.migrate
-- applies the files of this folder before each service's own.
-- The Row-Level Security key. A unit of work of a staff or admin user sets cuty.merchant to that
-- user's merchant with SET LOCAL (cutylib.tenancy.scoped), so a query that forgot its
-- `WHERE merchant_id = $n` still sees only that merchant's rows. Unset (or '*') is every merchant:
-- the orchestrator's and customers' paths (which filter by customer) never set it, so they pay no
-- extra round trip. Unset rather than a session default set at connect time, because a session
-- parameter does not survive PgBouncer in transaction mode (deploy/k8s/overlays/prod/poolers.yaml),
-- while SET LOCAL lives exactly as long as the transaction, which the pooler keeps on one server
-- connection. A row whose merchant is not known yet (NULL) is visible to "every merchant" only.
CREATE OR REPLACE FUNCTION cuty_merchant_visible(m text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(nullif(current_setting('cuty.merchant', true), ''), '*') IN ('*', m)
$$;
