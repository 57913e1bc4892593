-- The invariant auditor (payments/audit.py; docs/payments.md, "The invariant auditor"): a periodic
-- job that proves, one time window after another, that payments, booking, the code pool and the
-- PSP agree. Its findings and its watermarks are the platform's, not a merchant's: a PSP charge no
-- payment knows of has no merchant. So no merchant_id key and no RLS (like psp_events; the merchant a
-- finding concerns, when there is one, is `of_merchant`, as in operator_reads); the service role
-- reads and writes them (cuty_service_role's default privileges).

-- One row per violation found: its kind, the offending id (`subject`, unique per kind, so auditing
-- a window again records nothing twice), the ids around it, and the window it was found in.
CREATE TABLE audit_findings (
    id           bigserial PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN (
        'psp_charge_unknown', 'payment_unresolved', 'charge_missing', 'amount_mismatch', 'psp_refund_unknown',
        'hold_not_confirmed', 'hold_without_checkout', 'codes_count_mismatch', 'codes_without_checkout',
        'code_delivered_twice')),
    subject      text NOT NULL CHECK (subject <> '' AND length(subject) <= 300),
    checkout_id  uuid,
    payment_id   uuid,
    psp_id       text CHECK (length(psp_id) <= 255),
    other_id     text CHECK (length(other_id) <= 300),
    of_merchant  text CHECK (length(of_merchant) <= 200),
    detail       text NOT NULL DEFAULT '' CHECK (length(detail) <= 2000),
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL CHECK (window_end > window_start),
    found_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT audit_findings_once UNIQUE (kind, subject)
);
-- `ops audit --since`: the findings of windows ending after an instant.
CREATE INDEX audit_findings_window ON audit_findings (window_end);

-- How far each periodic reconciliation has come: the auditor's windows ('invariants') and the
-- dispute poller's cursor ('disputes'). Advanced by a conditional UPDATE (WHERE watermark = the
-- value read), so a replica that lost its lease mid-round cannot move it back or skip a window.
CREATE TABLE audit_watermarks (
    name       text PRIMARY KEY CHECK (name IN ('invariants', 'disputes')),
    watermark  timestamptz NOT NULL,
    -- the dispute poller's tie-breaker within one instant (the PSP's dispute id)
    after_id   text NOT NULL DEFAULT '' CHECK (length(after_id) <= 255),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Which replica runs each periodic job (cutylib.metrics.LeaseLeader, as the code pool's metrics
-- leader): a lease row per name, taken, renewed or taken over by one conditional statement.
CREATE TABLE IF NOT EXISTS metrics_leases (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    expires_at timestamptz NOT NULL
);
