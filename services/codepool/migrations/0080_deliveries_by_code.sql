-- cuty:no-transaction
-- Every order a code went to, released ones too (the incident story, codepool/incident.py
-- DELIVERIES): deliveries_one_active_per_code holds only the active one. Built without blocking
-- the serving version's writes (docs/deploy.md, "Schema changes while the old version serves").
CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveries_by_code ON deliveries (merchant_id, code_id);
