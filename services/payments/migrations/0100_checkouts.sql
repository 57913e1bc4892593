-- The checkout saga (issue 5, docs/checkout.md). One row per checkout, advanced with a version
-- token; the row also carries the worker queue (next_run_at) and the saga lease.

CREATE TABLE checkouts (
    id              uuid PRIMARY KEY,
    -- The caller's principal (JWT sub), never a request field.
    customer_id     text NOT NULL CHECK (customer_id <> ''),
    kind            text NOT NULL CHECK (kind IN ('booking', 'codes')),
    state           text NOT NULL DEFAULT 'PENDING' CHECK (state IN (
        'PENDING', 'HELD', 'CHARGING', 'AWAITING_ACTION', 'CONFIRMING', 'COMPLETED', 'RELEASING',
        'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDING', 'REFUNDED')),
    -- Where RELEASING leads once the hold is given back.
    outcome         text CHECK (outcome IN ('FAILED', 'EXPIRED', 'CANCELLED')),
    version         bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    slot_id         uuid,
    product_id      uuid,
    quantity        integer NOT NULL DEFAULT 1 CHECK (quantity BETWEEN 1 AND 100),
    hold_id         text,                 -- booking hold (kind booking)
    order_id        uuid,                 -- code-pool order (kind codes; = checkout id)
    -- From the hold / reservation (the slot or product price), never from the client.
    amount_minor    bigint CHECK (amount_minor >= 0),
    currency        text CHECK (currency ~ '^[A-Z]{3}$'),
    expire_time     timestamptz,          -- the hold's (or reservation's) expiry as last learned
    extended        boolean NOT NULL DEFAULT false,
    -- The payment attempt id: the payment's idempotency key and the PSP Idempotency-Key. One attempt
    -- per checkout, so a retried charge step can only ever find the same payment.
    payment_key     uuid UNIQUE,
    payment_id      uuid,
    payment_method  text,
    failure_reason  text NOT NULL DEFAULT '',
    -- The worker queue: a row is due when next_run_at has passed (NULL: nothing to do, terminal).
    -- Claiming a row pushes next_run_at to the end of its lease, so a worker killed mid-step leaves
    -- a row that becomes due again exactly when its lease runs out.
    next_run_at     timestamptz,
    lease_owner     text,
    lease_until     timestamptz,
    -- Set by the payment transition hook while a lease is held, so the holder does not sleep
    -- through a payment change that happened during its step (a lost wake-up).
    wakeup          boolean NOT NULL DEFAULT false,
    -- Consecutive retryable failures of the current step (backoff exponent); reset by a transition.
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT checkouts_target CHECK (
        (kind = 'booking' AND slot_id IS NOT NULL AND product_id IS NULL AND quantity = 1)
        OR (kind = 'codes' AND product_id IS NOT NULL AND slot_id IS NULL)),
    CONSTRAINT checkouts_releasing_has_outcome CHECK (state <> 'RELEASING' OR outcome IS NOT NULL),
    -- Past PENDING/REJECTED a checkout holds something: a hold id or an order, a price, an expiry.
    CONSTRAINT checkouts_held_has_hold CHECK (
        state IN ('PENDING', 'REJECTED')
        OR ((hold_id IS NOT NULL OR order_id IS NOT NULL) AND amount_minor IS NOT NULL
            AND currency IS NOT NULL AND expire_time IS NOT NULL)),
    CONSTRAINT checkouts_charging_has_key CHECK (
        state IN ('PENDING', 'HELD', 'REJECTED') OR outcome IN ('EXPIRED', 'CANCELLED') OR payment_key IS NOT NULL),
    CONSTRAINT checkouts_lease_whole CHECK ((lease_owner IS NULL) = (lease_until IS NULL)),
    -- A terminal saga has nothing left to do: workers never pick it again.
    CONSTRAINT checkouts_terminal_idle CHECK (
        state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED')
        OR (next_run_at IS NULL AND lease_owner IS NULL))
);

-- The workers' queue: SKIP LOCKED walks this partial index from the oldest due row.
CREATE INDEX checkouts_due ON checkouts (next_run_at) WHERE next_run_at IS NOT NULL;

-- The saga's transition table, as in payments/checkout/domain.py, so a wrong move is refused by
-- the database whatever code wrote it; a state change must bump the version by exactly one.
CREATE FUNCTION checkouts_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version <> OLD.version AND NEW.version <> OLD.version + 1 THEN
        RAISE EXCEPTION 'checkout % version must rise by one, % -> %', OLD.id, OLD.version, NEW.version
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NEW.version <> OLD.version + 1 THEN
            RAISE EXCEPTION 'checkout % state change without a version bump', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NOT (
            (OLD.state = 'PENDING' AND NEW.state IN ('HELD', 'REJECTED'))
            OR (OLD.state = 'HELD' AND NEW.state IN ('CHARGING', 'RELEASING'))
            OR (OLD.state = 'CHARGING' AND NEW.state IN ('AWAITING_ACTION', 'CONFIRMING', 'RELEASING'))
            OR (OLD.state = 'AWAITING_ACTION' AND NEW.state IN ('CHARGING', 'CONFIRMING', 'RELEASING'))
            OR (OLD.state = 'CONFIRMING' AND NEW.state IN ('COMPLETED', 'REFUNDING'))
            OR (OLD.state = 'RELEASING' AND NEW.state IN ('FAILED', 'EXPIRED', 'CANCELLED', 'CONFIRMING', 'REFUNDING'))
            OR (OLD.state = 'REFUNDING' AND NEW.state = 'REFUNDED')
        ) THEN
            RAISE EXCEPTION 'checkout % may not move from % to %', OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF OLD.payment_key IS NOT NULL AND NEW.payment_key IS DISTINCT FROM OLD.payment_key THEN
        RAISE EXCEPTION 'checkout % payment attempt may not change', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.payment_id IS NOT NULL AND NEW.payment_id IS DISTINCT FROM OLD.payment_id THEN
        RAISE EXCEPTION 'checkout % payment may not change', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER checkouts_forward_only BEFORE UPDATE ON checkouts
    FOR EACH ROW EXECUTE FUNCTION checkouts_forward_only();

-- Only a checkout that never held anything may disappear (a CreateCheckout refused for bad input:
-- "nothing changes"); everything else is history.
CREATE FUNCTION checkouts_keep_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state <> 'PENDING' THEN
        RAISE EXCEPTION 'checkout % in state % may not be deleted', OLD.id, OLD.state
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER checkouts_keep_history BEFORE DELETE ON checkouts
    FOR EACH ROW EXECUTE FUNCTION checkouts_keep_history();

-- Idempotency-Key of the checkout API (DESIGN.md invariant 7): UNIQUE (customer, operation, key).
-- The first request inserts 'in_flight' and, when done, stores its serialized answer (a Checkout
-- or a google.rpc.Status), which every replay returns byte for byte.
CREATE TABLE checkout_idempotency_keys (
    customer_id   text NOT NULL,
    operation     text NOT NULL CHECK (operation IN ('create', 'pay')),
    key           text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request_hash  bytea NOT NULL,
    -- The checkout a create works on, fixed by the first request, so a retry of a request whose
    -- process died resumes the same checkout instead of holding a second slot.
    resource_id   uuid NOT NULL,
    state         text NOT NULL CHECK (state IN ('in_flight', 'done')),
    response      bytea,
    response_is_error boolean,
    -- An in-flight request whose process died is taken over once this passes; `runs` counts the
    -- takeovers, so the resumed request knows it continues an earlier one.
    locked_until  timestamptz,
    runs          integer NOT NULL DEFAULT 1,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (customer_id, operation, key),
    CHECK ((state = 'done') = (response IS NOT NULL AND response_is_error IS NOT NULL))
);

CREATE INDEX checkout_idempotency_keys_expiry ON checkout_idempotency_keys (expires_at);
