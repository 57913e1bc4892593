-- Issue 10, item 12: every plaintext read of a code is audited. RevealCode was ('reveal'); the
-- buyer's GetDeliveredCodes is now too, as 'read_delivered' (the order, its codes, who asked).
ALTER TABLE audit_log DROP CONSTRAINT audit_log_action_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_action_check CHECK (action IN (
    'import', 'import_rejected', 'reserve', 'deliver', 'deliver_rejected', 'release', 'expire', 'reveal', 'rotate',
    'read_delivered'));
