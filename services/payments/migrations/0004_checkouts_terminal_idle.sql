-- A finished saga has nothing scheduled and no lease: the CHECK now names every finished state of
-- payments/checkout/domain.py TERMINAL (CANCELLED_AFTER_PURCHASE was missing from it; the saga's
-- TRANSITION already cleared both for it). tests/integration/payments/test_saga_state_lists.py
-- compares this list, and every other list of states in the schema, with the domain's.
ALTER TABLE checkouts DROP CONSTRAINT checkouts_terminal_idle,
    ADD CONSTRAINT checkouts_terminal_idle CHECK (
        state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED', 'CANCELLED_AFTER_PURCHASE')
        OR (next_run_at IS NULL AND lease_owner IS NULL));
