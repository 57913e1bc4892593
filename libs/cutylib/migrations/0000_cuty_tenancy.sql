-- Merchants as tenants (issue 14, docs/tenancy.md): the functions every service database shares.
-- cutylib.db.migrate applies this file with each service's own migrations, in name order.

-- The Row-Level Security key. A unit of work of a staff or admin user sets cuty.merchant to that
-- user's merchant with SET LOCAL (cutylib.tenancy.scoped), so a query that forgot its
-- `WHERE merchant_id = $n` still sees only that merchant's rows. Unset (or '*') is every merchant:
-- the orchestrator's and customers' paths (which filter by customer) never set it, so they pay no
-- extra round trip. Unset rather than a session default set at connect time, because a session
-- parameter does not survive PgBouncer in transaction mode (deploy/k8s/overlays/prod/poolers.yaml),
-- while SET LOCAL lives exactly as long as the transaction, which the pooler keeps on one server
-- connection. A row whose merchant is not known yet (NULL) is visible to "every merchant" only.
CREATE FUNCTION cuty_merchant_visible(m text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(nullif(current_setting('cuty.merchant', true), ''), '*') IN ('*', m)
$$;

-- A row's merchant is set when the row is created and never changes. A row that learns its
-- merchant after it is created (a checkout, from its hold) may go from NULL to a merchant, once.
CREATE FUNCTION cuty_merchant_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.merchant_id IS NOT NULL AND NEW.merchant_id IS DISTINCT FROM OLD.merchant_id THEN
        RAISE EXCEPTION 'the merchant of a % row never changes', TG_TABLE_NAME
            USING ERRCODE = 'integrity_constraint_violation',
                  DETAIL = format('%s -> %s', OLD.merchant_id, NEW.merchant_id);
    END IF;
    RETURN NEW;
END
$$;

-- Makes `t` (which has a `merchant_id text` column) a merchant's table: RLS enabled and forced
-- (so the owning role is bound too; only a superuser bypasses it), one policy for reads and
-- writes, and the immutability trigger. The one way every service declares a tenant table.
CREATE FUNCTION cuty_tenant_table(t regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', t);
    EXECUTE format('CREATE POLICY merchant_isolation ON %s USING (cuty_merchant_visible(merchant_id)) '
                   'WITH CHECK (cuty_merchant_visible(merchant_id))', t);
    EXECUTE format('CREATE TRIGGER merchant_immutable BEFORE UPDATE OF merchant_id ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION cuty_merchant_immutable()', t);
END
$$;
