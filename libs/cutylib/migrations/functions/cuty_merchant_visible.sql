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
-- PL/pgSQL, not an inlined SQL function, for the planner's sake: inlined, the policy became
-- `current_setting(..) = ANY (ARRAY['*', merchant_id])`, which the planner takes to keep one row
-- in ~170 (it cannot know the setting), so a merchant's list page, believing its filters matched a
-- handful of rows, read all of them to sort them: 0.5-1 s for a salon's or a product's checkouts
-- of a year (`make bench-growth`, docs/benchmarks.md). A function call it cannot see into gets the
-- default third, and the list walks its index in order and stops at the page. The cost is a call
-- per row read (about a microsecond), on statements that read few rows.
CREATE OR REPLACE FUNCTION cuty_merchant_visible(m text) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN current_setting('cuty.merchant', true) IN ('*', m);
END
$$;
