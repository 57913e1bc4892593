-- Database roles (docs/security.md): a function every service database shares; cutylib.db.migrate
-- applies the files of this folder before each service's own. A service's numbered migration calls
-- it once with the role the service connects as: `SELECT cuty_service_role('booking_service');`.
-- The role owns nothing, so it cannot drop, alter or disable Row-Level Security on any table (the
-- owner, who runs the migrations, can); it reads and writes rows, uses sequences, calls functions,
-- and reads which migrations are applied (a replica waiting for the migrate Job). It is created
-- here, without LOGIN, only where the migrating role may create roles and it does not exist yet
-- (cutylib.db.ensure_service_role makes it a login role in the tests and `make run`); in
-- Kubernetes CloudNativePG creates it, a managed role, before the Job runs (docs/deploy.md).
-- No statement runs for ever, whoever runs it (a person's psql, a tool, the service): the
-- database's default statement timeout; the service role has a shorter one of its own where it is
-- created, and the migration runner sets a bound of its own (CUTY_MIGRATION_STATEMENT_TIMEOUT).
CREATE OR REPLACE FUNCTION cuty_service_role(r name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE', r);
    END IF;
    REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', r);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO %I', r);
    EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON schema_migrations FROM %I', r);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO %I', r);
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO %I', r);
    -- Tables, sequences and functions of later migrations (created by the same owner) get the same.
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I', r);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO %I', r);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT EXECUTE ON FUNCTIONS TO %I', r);
    EXECUTE format('ALTER DATABASE %I SET statement_timeout = %L', current_database(), '60s');
END
$$;
