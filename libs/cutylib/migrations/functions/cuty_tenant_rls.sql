-- Row-Level Security of a merchant's table (docs/tenancy.md): forced, keyed by cuty.merchant
-- (cuty_merchant_visible). Called by cuty_tenant_table, and for each partition of a partitioned
-- merchant's table (cuty_partitions_ahead): a partition is a table the services' role may name
-- directly, so it keeps the same policy as its parent.
CREATE OR REPLACE FUNCTION cuty_tenant_rls(t regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', t);
    EXECUTE format('CREATE POLICY merchant_isolation ON %s USING (cuty_merchant_visible(merchant_id)) '
                   'WITH CHECK (cuty_merchant_visible(merchant_id))', t);
END
$$;
