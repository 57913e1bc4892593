-- The role payments connects as: owns nothing, cannot change Row-Level Security, reads and writes rows
-- (libs/cutylib/migrations/functions/cuty_service_role.sql; docs/security.md, "Database roles").
SELECT cuty_service_role('payments_service');
