-- Which replica exports the gauges read from the database (cutylib.metrics.LeaseLeader): one lease
-- row per name, taken, renewed or taken over by a single conditional statement, so leadership
-- holds through PgBouncer in transaction mode, where a session advisory lock would stay on a
-- server connection other clients share. Not a merchant's data: no merchant_id, no RLS.
CREATE TABLE metrics_leases (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    expires_at timestamptz NOT NULL
);
