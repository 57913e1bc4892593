-- Merchants as tenants (docs/tenancy.md): a function every service database shares; cutylib.db.migrate
-- applies the files of this folder before each service's own.
-- A row's merchant is set when the row is created and never changes. A row that learns its
-- merchant after it is created (a checkout, from its hold) may go from NULL to a merchant, once.
CREATE OR REPLACE FUNCTION cuty_merchant_immutable() RETURNS trigger
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
