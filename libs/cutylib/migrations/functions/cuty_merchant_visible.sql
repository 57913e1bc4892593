-- Merchants as tenants (docs/tenancy.md): a function every service database shares; cutylib.db.migrate
-- applies the files of this folder before each service's own.
-- The Row-Level Security key, failing closed: a row is visible when cuty.merchant is its merchant
-- or '*' (every merchant); unset or '' sees no row at all, so a statement that says nothing about
-- whose rows it reads reads none. A staff or admin unit of work sets its merchant with SET LOCAL
-- (cutylib.tenancy.scoped, and the pool narrows a stray statement of such a caller the same way);
-- the orchestrator's, customers' and the services' own paths say '*' explicitly: the service's
-- pool declares it (cutylib.db.create_pool(merchant='*')), sent once per session as a startup
-- parameter where the connection is direct, or with each transaction's BEGIN behind PgBouncer in
-- transaction mode (deploy/k8s/overlays/prod/poolers.yaml), which refuses unknown startup
-- parameters and does not carry a session setting from one server connection to the next; the
-- hot single statements set it themselves (a function declared SET cuty.merchant = '*').
-- A row whose merchant is not known yet (NULL) is visible to '*' only.
CREATE OR REPLACE FUNCTION cuty_merchant_visible(m text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT current_setting('cuty.merchant', true) IN ('*', m)
$$;
