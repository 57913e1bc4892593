-- Merchants as tenants (docs/tenancy.md): a function every service database shares; cutylib.db.migrate
-- applies the files of this folder before each service's own.
-- Makes `t` (which has a `merchant_id text` column) a merchant's table: RLS enabled and forced
-- (so the owning role is bound too; only a superuser bypasses it), one policy for reads and
-- writes, and the immutability trigger. The one way every service declares a tenant table.
CREATE OR REPLACE FUNCTION cuty_tenant_table(t regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cuty_tenant_rls(t);
    EXECUTE format('CREATE TRIGGER merchant_immutable BEFORE UPDATE OF merchant_id ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION cuty_merchant_immutable()', t);
END
$$;
