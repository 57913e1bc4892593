-- The payments service's schema: the payments core, the PSP's events, the checkout saga, refunds,
-- live updates, outbound events for merchants and the operator's read log. Tables, constraints,
-- indexes, trigger declarations and row-level security; the trigger functions are in functions/
-- (one file each, applied before this file: cutylib.db.migrate).
--
-- Merchants as tenants (docs/tenancy.md): a checkout and its payment belong to the merchant of what
-- was bought, and every merchant's table is declared with cuty_tenant_table (RLS, the immutable
-- merchant_id); the PSP's events, the customers' Idempotency-Keys, the watch streams, the relay's
-- cursor and the operator's read log stay global.


-- ================================================================================================
-- Payments core
-- ================================================================================================
-- Payments against the PSP. One finalize path writes `payments` with a version token; every accepted
-- change appends to `payment_events` in the same transaction.
--
-- Refunds by the merchant's staff (full or partial, never more than captured) are rows of `refunds`
-- (below), and the payment keeps two running totals, written by the same statement that inserts or
-- settles a refund (payments/repository.py RESERVE_REFUND, SETTLE_REFUND):
--   refunded_minor        what is refunded or being refunded (pending + succeeded refunds). The CHECK
--                         refunded_minor <= amount_minor is what refuses an over-refund, whoever races:
--                         the reservation is one conditional UPDATE of the payment row, so concurrent
--                         refunds for the last amount queue on that row and exactly the ones that fit
--                         succeed.
--   refund_settled_minor  what the PSP confirmed; it decides the status (partially_refunded while
--                         0 < settled < amount, refunded at amount).

CREATE TABLE payments (
    id               uuid PRIMARY KEY,
    checkout_id      uuid,
    customer_id      text NOT NULL DEFAULT '',
    status           text NOT NULL DEFAULT 'created'
        CONSTRAINT payments_status_check CHECK (status IN (
            'created', 'requires_action', 'processing', 'succeeded', 'failed', 'canceled', 'partially_refunded',
            'refunded')),
    -- The version token: every accepted change is UPDATE ... WHERE id = $1 AND version = $2.
    version          bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    -- The lease keeps two webhook/reconcile workers off one payment; a worker whose lease expired
    -- and was taken over is fenced by the version token, not by the lease.
    lease_owner      text,
    lease_until      timestamptz,
    -- Unique on its own: it is the PSP's id space, and a webhook (global, signed by the PSP) names
    -- the intent before anyone knows whose payment it is.
    psp_intent_id    text UNIQUE,
    psp_refund_id    text,
    -- From our own records, never from the client.
    amount_minor     bigint NOT NULL CHECK (amount_minor > 0),
    currency         text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    payment_method   text NOT NULL CHECK (payment_method <> ''),
    -- The payment attempt id; also the PSP's Idempotency-Key.
    idempotency_key  text NOT NULL CHECK (idempotency_key <> ''),
    redirect_url     text,
    client_secret    text,
    failure_reason   text,
    -- When reconciliation should next ask the PSP; NULL once terminal.
    reconcile_at     timestamptz,
    reconcile_attempts integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The checkout's merchant, given when the payment is created (CreatePaymentRequest).
    merchant_id      text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    refunded_minor   bigint NOT NULL DEFAULT 0,
    refund_settled_minor bigint NOT NULL DEFAULT 0,
    -- Invariant 6 (docs/architecture.md) at the storage level: only a payment waiting for the customer keeps
    -- the customer action, so no code path can hand a terminal payment's secret to anyone.
    CONSTRAINT payments_action_only_while_waiting
        CHECK (status = 'requires_action' OR (redirect_url IS NULL AND client_secret IS NULL)),
    CONSTRAINT payments_lease_whole CHECK ((lease_owner IS NULL) = (lease_until IS NULL)),
    CONSTRAINT payments_idempotency_key UNIQUE (merchant_id, idempotency_key),
    CONSTRAINT payments_merchant_id UNIQUE (merchant_id, id),
    CONSTRAINT payments_refunds_within_capture CHECK (
        refund_settled_minor >= 0 AND refund_settled_minor <= refunded_minor AND refunded_minor <= amount_minor),
    -- Only a captured payment has anything refunded, and the status says how much was settled.
    CONSTRAINT payments_refunds_only_captured CHECK (
        refunded_minor = 0 OR status IN ('succeeded', 'partially_refunded', 'refunded')),
    CONSTRAINT payments_refund_status CHECK (
        (status = 'refunded') = (refund_settled_minor = amount_minor)
        AND (status = 'partially_refunded') = (refund_settled_minor > 0 AND refund_settled_minor < amount_minor))
);

CREATE INDEX payments_checkout ON payments (merchant_id, checkout_id) WHERE checkout_id IS NOT NULL;
-- The reconciliation poller's queue: SKIP LOCKED walks this small partial index.
CREATE INDEX payments_reconcile_due ON payments (reconcile_at)
    WHERE status IN ('created', 'requires_action', 'processing');

CREATE TRIGGER payments_forward_only BEFORE UPDATE ON payments
    FOR EACH ROW EXECUTE FUNCTION payments_forward_only();

SELECT cuty_tenant_table('payments');

-- The timeline: "what happened to payment X" without a tracing backend. The checkout saga appends
-- its own transitions here too (checkout_id set, payment_id possibly NULL). Each event carries the
-- merchant of its payment or checkout, filled by the trigger payment_events_merchant.
CREATE TABLE payment_events (
    seq          bigserial PRIMARY KEY,
    payment_id   uuid REFERENCES payments (id),
    checkout_id  uuid,
    source       text NOT NULL CHECK (source IN ('sync', 'webhook', 'reconcile', 'saga')),
    from_status  text,
    to_status    text NOT NULL,
    version      bigint,
    trace_id     text NOT NULL DEFAULT '',
    note         text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id  text,
    CHECK (payment_id IS NOT NULL OR checkout_id IS NOT NULL)
);

CREATE INDEX payment_events_payment ON payment_events (merchant_id, payment_id, seq) WHERE payment_id IS NOT NULL;
-- Also what a checkout watcher replays its transitions after an event id from (the SSE Last-Event-ID).
CREATE INDEX payment_events_checkout ON payment_events (checkout_id, seq) WHERE checkout_id IS NOT NULL;

CREATE TRIGGER payment_events_append_only BEFORE UPDATE OR DELETE ON payment_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_append_only();
CREATE TRIGGER payment_events_merchant BEFORE INSERT ON payment_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_merchant();

SELECT cuty_tenant_table('payment_events');


-- ================================================================================================
-- PSP events
-- ================================================================================================
-- PSP webhook events, stored (deduplicated on the PSP's event id) before the PSP is acknowledged.
-- Stored without the intent's client secret and 3-D Secure redirect (webhooks.without_secrets);
-- handled events are purged after CUTY_PSP_EVENT_RETENTION_DAYS by the payments service's purge
-- worker, oldest first through psp_events_handled.
CREATE TABLE psp_events (
    event_id         text PRIMARY KEY,
    type             text NOT NULL,
    payment_id       uuid REFERENCES payments (id),
    payload          jsonb NOT NULL,
    -- received: stored, being handled inline; deferred: the payment's lease was held by another
    -- worker, retried at next_attempt_at; processed / ignored: done.
    status           text NOT NULL DEFAULT 'received'
        CHECK (status IN ('received', 'processed', 'deferred', 'ignored')),
    attempts         integer NOT NULL DEFAULT 0,
    -- A 'received' event whose inline handling died (process killed) is picked up once this passes.
    next_attempt_at  timestamptz,
    last_error       text NOT NULL DEFAULT '',
    received_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    processed_at     timestamptz
);

CREATE INDEX psp_events_due ON psp_events (next_attempt_at) WHERE status IN ('received', 'deferred');
CREATE INDEX psp_events_payment ON psp_events (payment_id) WHERE payment_id IS NOT NULL;
CREATE INDEX psp_events_handled ON psp_events (processed_at) WHERE status IN ('processed', 'ignored');


-- ================================================================================================
-- Checkouts: the saga
-- ================================================================================================
-- The checkout saga (docs/checkout.md). One row per checkout, advanced with a version token; the row
-- also carries the worker queue (next_run_at) and the saga lease.
--
-- A step that keeps failing (a refund or cancel the PSP keeps refusing, an unexpected answer from
-- booking or the code pool) does not retry forever: after CUTY_SAGA_MAX_ATTEMPTS attempts or
-- CUTY_SAGA_ATTENTION_AFTER_SECONDS of failing, a saga in a finishing step moves to NEEDS_ATTENTION:
-- kept (never dropped), off the worker queue, visible to staff, counted, and put back into the state
-- it left by an operator (RetryCheckout). docs/checkout.md, "Needs attention".
--
-- Cancellation after purchase (docs/checkout.md, "Cancel after purchase"): a COMPLETED booking may be
-- cancelled by its customer (refund per the salon's cancellation policy, copied from the hold at
-- purchase) or by the merchant's staff (full refund, with a reason): COMPLETED -> CANCELLING (the
-- refund, then booking's CancelBooking frees the slot) -> CANCELLED_AFTER_PURCHASE.
--
-- Reschedule of a COMPLETED booking to another slot of its salon (docs/checkout.md, "Reschedule"),
-- with the same saga row, workers, leases, retries and NEEDS_ATTENTION as every other step:
--   COMPLETED -> RESCHEDULING          hold the new slot (booking.HoldSlot, the database decides a race);
--                                      a price increase: charge the difference (a second payment)
--   RESCHEDULING -> RESCHEDULE_CONFIRMING  confirm the new hold, cancel the old booking
--                                      (booking.CancelBooking), refund a price decrease -> COMPLETED
--   RESCHEDULING | RESCHEDULE_CONFIRMING -> RESCHEDULE_REVERTING  compensation: cancel / refund the
--                                      difference's payment, release the new hold -> COMPLETED (unchanged)
--   RESCHEDULING -> COMPLETED          the new slot was refused at once (taken: nothing to undo)
-- The old booking is given up only after the new one is confirmed, and the new one is confirmed only
-- after its difference was captured: never both lost; the old one is released in the step that
-- confirmed the new one, repeated until done: never both kept once the saga is COMPLETED.

CREATE TABLE checkouts (
    id              uuid PRIMARY KEY,
    -- The caller's principal (JWT sub), never a request field.
    customer_id     text NOT NULL CHECK (customer_id <> ''),
    kind            text NOT NULL CHECK (kind IN ('booking', 'codes')),
    state           text NOT NULL DEFAULT 'PENDING' CONSTRAINT checkouts_state_check CHECK (state IN (
        'PENDING', 'HELD', 'CHARGING', 'AWAITING_ACTION', 'CONFIRMING', 'COMPLETED', 'RELEASING',
        'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDING', 'REFUNDED', 'NEEDS_ATTENTION',
        'CANCELLING', 'CANCELLED_AFTER_PURCHASE', 'RESCHEDULING', 'RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING')),
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
    -- per checkout, so a retried charge step can only ever find the same payment. Unique within its
    -- merchant (checkouts_payment_key): a checkout gets one only once it holds something, so its
    -- merchant is known by then.
    payment_key     uuid,
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
    -- "One trace per checkout": the W3C traceparent of the request that created the checkout. Saga
    -- steps run later by any worker continue that trace (docs/observability.md).
    traceparent     text,
    -- When the current step first failed (NULL: it has not); reset by every transition.
    failing_since   timestamptz,
    -- The state a NEEDS_ATTENTION saga left, which an operator's retry returns it to.
    attention_from  text CONSTRAINT checkouts_attention_from_check
        CHECK (attention_from IN ('CONFIRMING', 'RELEASING', 'REFUNDING', 'CANCELLING', 'RESCHEDULING',
                                  'RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING')),
    -- The merchant, learned from the hold or reservation (booking's / the code pool's answer) and
    -- recorded by the transition to HELD in the same statement; before that (PENDING, or REJECTED
    -- without anything held) it is NULL and only the customer and the platform see the checkout.
    -- Once set it never changes (cuty_merchant_immutable).
    merchant_id     text CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    -- The salon of a booking, recorded with its hold and its merchant by the saga's TRANSITION
    -- (`salon_id = COALESCE(salon_id, $n)`, from booking's Hold.salon_id); code purchases have none.
    salon_id        uuid,
    -- The booking's cancellation policy and start, recorded with the hold (the TRANSITION to HELD),
    -- so the policy shown at purchase is the one applied even if the salon changes it later. NULL for
    -- code purchases.
    free_cancellation_hours integer CHECK (free_cancellation_hours >= 0),
    cancellation_fee_percent integer CHECK (cancellation_fee_percent BETWEEN 0 AND 100),
    start_time      timestamptz,
    -- Decided by the statement that starts the cancel (database clock), never changed after.
    refund_amount_minor bigint CHECK (refund_amount_minor >= 0),
    cancelled_by    text,
    cancel_reason   text,
    -- The reschedule under way (or the last one): written by START_RESCHEDULE (which resets the facts
    -- of the previous one and numbers this one: its steps' idempotency keys carry the number), learned
    -- by its steps, and on success swapped into slot_id / hold_id / amount_minor / start_time.
    reschedule_seq  integer NOT NULL DEFAULT 0 CHECK (reschedule_seq >= 0),
    reschedules     integer NOT NULL DEFAULT 0 CHECK (reschedules >= 0 AND reschedules <= reschedule_seq),
    reschedule_status text CHECK (reschedule_status IN ('in_progress', 'rescheduled', 'reverted')),
    reschedule_slot_id uuid,
    reschedule_from_slot_id uuid,
    reschedule_from_hold_id text,
    reschedule_from_amount_minor bigint,
    reschedule_hold_id text,
    reschedule_amount_minor bigint CHECK (reschedule_amount_minor >= 0),
    reschedule_start_time timestamptz,
    reschedule_expire_time timestamptz,
    reschedule_payment_method text,
    reschedule_payment_id uuid,
    rescheduled_by  text,
    reschedule_failure text NOT NULL DEFAULT '',
    CONSTRAINT checkouts_target CHECK (
        (kind = 'booking' AND slot_id IS NOT NULL AND product_id IS NULL AND quantity = 1)
        OR (kind = 'codes' AND product_id IS NOT NULL AND slot_id IS NULL)),
    CONSTRAINT checkouts_releasing_has_outcome CHECK (state <> 'RELEASING' OR outcome IS NOT NULL),
    -- Past PENDING/REJECTED a checkout holds something: a hold id or an order, a price, an expiry,
    -- and belongs to a merchant.
    CONSTRAINT checkouts_held_has_hold CHECK (
        state IN ('PENDING', 'REJECTED')
        OR ((hold_id IS NOT NULL OR order_id IS NOT NULL) AND amount_minor IS NOT NULL
            AND currency IS NOT NULL AND expire_time IS NOT NULL)),
    CONSTRAINT checkouts_held_has_merchant CHECK (state IN ('PENDING', 'REJECTED') OR merchant_id IS NOT NULL),
    CONSTRAINT checkouts_charging_has_key CHECK (
        state IN ('PENDING', 'HELD', 'REJECTED') OR outcome IN ('EXPIRED', 'CANCELLED') OR payment_key IS NOT NULL),
    CONSTRAINT checkouts_lease_whole CHECK ((lease_owner IS NULL) = (lease_until IS NULL)),
    -- A terminal saga has nothing left to do: workers never pick it again.
    CONSTRAINT checkouts_terminal_idle CHECK (
        state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED')
        OR (next_run_at IS NULL AND lease_owner IS NULL)),
    CONSTRAINT checkouts_attention_whole CHECK ((state = 'NEEDS_ATTENTION') = (attention_from IS NOT NULL)),
    -- Waiting for a human: no worker picks it up.
    CONSTRAINT checkouts_attention_idle CHECK (
        state <> 'NEEDS_ATTENTION' OR (next_run_at IS NULL AND lease_owner IS NULL)),
    CONSTRAINT checkouts_cancel_whole CHECK (
        (refund_amount_minor IS NULL) = (cancelled_by IS NULL)
        AND (state NOT IN ('CANCELLING', 'CANCELLED_AFTER_PURCHASE') OR refund_amount_minor IS NOT NULL)),
    CONSTRAINT checkouts_reschedule_whole CHECK (
        (state NOT IN ('RESCHEDULING', 'RESCHEDULE_CONFIRMING', 'RESCHEDULE_REVERTING')
         OR (reschedule_status = 'in_progress' AND reschedule_slot_id IS NOT NULL))
        AND (state NOT IN ('RESCHEDULE_CONFIRMING') OR reschedule_hold_id IS NOT NULL)
        AND ((reschedule_status IS NULL) = (reschedule_slot_id IS NULL))),
    -- Keys ready for distribution by merchant.
    CONSTRAINT checkouts_payment_key UNIQUE (merchant_id, payment_key),
    CONSTRAINT checkouts_merchant_id UNIQUE (merchant_id, id)
);

-- The workers' queue: SKIP LOCKED walks this partial index from the oldest due row.
CREATE INDEX checkouts_due ON checkouts (next_run_at) WHERE next_run_at IS NOT NULL;
-- The "stuck sagas" gauges (payments/metrics.py) read, per non-terminal state, the count and the
-- oldest row every CUTY_METRICS_REFRESH_SECONDS: an index over the few live rows, not the history
-- (a booking cancelled after purchase is finished too; payments/metrics.py NON_TERMINAL, ops.py
-- STUCK say the same).
CREATE INDEX checkouts_live_by_state ON checkouts (state, updated_at)
    WHERE state NOT IN ('COMPLETED', 'REJECTED', 'FAILED', 'EXPIRED', 'CANCELLED', 'REFUNDED',
                        'CANCELLED_AFTER_PURCHASE');
-- Staff look for these; few rows, so a small partial index.
CREATE INDEX checkouts_needing_attention ON checkouts (updated_at) WHERE state = 'NEEDS_ATTENTION';
-- The lists of checkouts (ListCheckouts, docs/checkout.md "Lists"), newest first with the id as
-- tie-break (the keyset of the page tokens): staff and admins' lists lead with merchant_id
-- (docs/tenancy.md), one per filter that narrows a merchant's list by a column; the customer's list
-- by customer (customers are global); the operator's across merchants by time alone.
CREATE INDEX checkouts_merchant_list ON checkouts (merchant_id, created_at DESC, id DESC)
    WHERE merchant_id IS NOT NULL;
CREATE INDEX checkouts_merchant_salon ON checkouts (merchant_id, salon_id, created_at DESC, id DESC)
    WHERE salon_id IS NOT NULL;
CREATE INDEX checkouts_merchant_product ON checkouts (merchant_id, product_id, created_at DESC, id DESC)
    WHERE product_id IS NOT NULL;
CREATE INDEX checkouts_customer_list ON checkouts (customer_id, created_at DESC, id DESC);
CREATE INDEX checkouts_list ON checkouts (created_at DESC, id DESC);

CREATE TRIGGER checkouts_forward_only BEFORE UPDATE ON checkouts
    FOR EACH ROW EXECUTE FUNCTION checkouts_forward_only();
CREATE TRIGGER checkouts_keep_history BEFORE DELETE ON checkouts
    FOR EACH ROW EXECUTE FUNCTION checkouts_keep_history();

-- A payment's status change wakes its saga, in the statement that made it.
CREATE TRIGGER payments_wake_checkout AFTER UPDATE OF status ON payments
    FOR EACH ROW
    WHEN (NEW.checkout_id IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION checkouts_wake_on_payment();

SELECT cuty_tenant_table('checkouts');

-- Idempotency-Key of the checkout API (docs/architecture.md, invariant 7): UNIQUE (customer, operation, key).
-- The first request inserts 'in_flight' and, when done, stores its serialized answer (a Checkout
-- or a google.rpc.Status), which every replay returns byte for byte.
CREATE TABLE checkout_idempotency_keys (
    customer_id   text NOT NULL,
    operation     text NOT NULL CHECK (operation IN ('create', 'pay', 'reschedule')),
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


-- ================================================================================================
-- Refunds
-- ================================================================================================
-- One row per refund of a payment (the running totals are on the payment, above).
CREATE TABLE refunds (
    id              uuid PRIMARY KEY,
    merchant_id     text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    payment_id      uuid NOT NULL,
    -- The caller's Idempotency-Key (the saga's: its refund step key), unique per payment and merchant.
    key             text NOT NULL CHECK (key <> '' AND length(key) <= 255),
    -- What was asked: NULL = "the rest of what was captured" (kept to tell a replay from a reuse).
    requested_minor bigint CHECK (requested_minor > 0),
    amount_minor    bigint NOT NULL CHECK (amount_minor > 0),
    currency        text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    reason          text NOT NULL CHECK (reason <> '' AND length(reason) <= 500),
    requested_by    text NOT NULL CHECK (requested_by <> ''),
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'succeeded', 'failed')),
    psp_refund_id   text,
    failure_reason  text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT refunds_key UNIQUE (merchant_id, payment_id, key),
    CONSTRAINT refunds_merchant_id UNIQUE (merchant_id, id),
    CONSTRAINT refunds_payment FOREIGN KEY (merchant_id, payment_id) REFERENCES payments (merchant_id, id),
    CONSTRAINT refunds_settled_has_psp_id CHECK (status <> 'succeeded' OR psp_refund_id IS NOT NULL)
);
-- Pending refunds (a PSP timeout, a crash before the PSP call): what a retry or an operator finds.
CREATE INDEX refunds_pending ON refunds (created_at) WHERE status = 'pending';

CREATE TRIGGER refunds_forward_only BEFORE UPDATE ON refunds FOR EACH ROW EXECUTE FUNCTION refunds_forward_only();

SELECT cuty_tenant_table('refunds');


-- ================================================================================================
-- Live updates: watchers and watch streams
-- ================================================================================================
-- Every change of a checkout's state or version is NOTIFYed to the payments processes' watchers
-- (payments/checkout/live.py), in the transaction that made it.
CREATE TRIGGER checkouts_notify_watchers AFTER UPDATE OF state, version ON checkouts
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state OR NEW.version IS DISTINCT FROM OLD.version)
    EXECUTE FUNCTION checkouts_notify_watchers();

-- At most CUTY_MAX_WATCH_STREAMS_PER_USER open WatchCheckout streams per user, across every payments
-- replica (a stream lands on whichever replica the gateway's channel picks, so a count in one
-- process would not bound it). Each open stream holds one numbered place of its user: the primary
-- key (subject, slot) with slot < the cap is the bound, decided by the database. A place is leased:
-- its process renews the lease of all its places in one statement while it runs
-- (payments/checkout/live.py), so a process that died frees its users' places when the lease runs
-- out. The platform's own table (per user, not a merchant's data): no merchant_id.
CREATE TABLE watch_streams (
    subject     text NOT NULL CHECK (subject <> ''),
    slot        integer NOT NULL CHECK (slot >= 0),
    -- the process (renews the lease) and the stream (releases its place) holding it
    process     text NOT NULL,
    stream      text NOT NULL,
    lease_until timestamptz NOT NULL,
    opened_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (subject, slot)
);
CREATE INDEX watch_streams_process ON watch_streams (process);


-- ================================================================================================
-- Outbound events for merchants (docs/webhooks-out.md)
-- ================================================================================================
-- 1. merchant_events, the transactional outbox: written by a trigger on checkouts in the statement
--    (so the transaction) that changes the state. No state change without its event and no event
--    without its state change, by construction: both commit or neither does. `stock.low` is relayed
--    from the code pool's outbox (outbound_feeds, below).
-- 2. webhook_endpoints: registered by a merchant's admins (WebhookEndpointService).
-- 3. webhook_deliveries: one row per (event, subscribed endpoint), fanned out by the same trigger,
--    so no crash can fall between the event and its deliveries; delivery workers claim due rows
--    with FOR UPDATE SKIP LOCKED and a lease (payments/outbound/worker.py).
-- 4. webhook_attempts: the delivery log, one row per HTTP attempt.
-- Every table is a merchant's (cuty_tenant_table), keys lead with merchant_id.

CREATE TABLE merchant_events (
    merchant_id text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    id          uuid NOT NULL DEFAULT gen_random_uuid(),
    type        text NOT NULL CONSTRAINT merchant_events_type_check CHECK (type IN (
        'checkout.completed', 'booking.confirmed', 'codes.delivered', 'checkout.refunded', 'booking.cancelled',
        'booking.rescheduled', 'stock.low')),
    checkout_id uuid,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (merchant_id, id)
);
CREATE INDEX merchant_events_checkout ON merchant_events (merchant_id, checkout_id);
-- An event is history: never changed, never deleted.
CREATE TRIGGER merchant_events_append_only BEFORE UPDATE OR DELETE ON merchant_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_append_only();

-- The secret is the HMAC key of Cuty-Signature. Signing needs the secret itself (a hash would not
-- do), so it is stored as AES-256-GCM ciphertext under payments' own keyring
-- (CUTY_WEBHOOK_SECRET_KEYS; cutylib.keyring, the implementation the code pool's codes use), with
-- the key id per row for rotation; the associated data binds it to (merchant, endpoint). Never
-- returned after creation. `secret` is the plaintext form, which no row may be written with
-- (webhook_endpoints_no_plaintext); the delivery workers read either form (payments/outbound/secrets.py).
CREATE TABLE webhook_endpoints (
    merchant_id text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    id          uuid NOT NULL,
    url         text NOT NULL CHECK (length(url) BETWEEN 8 AND 2048),
    events      text[] NOT NULL CHECK (cardinality(events) >= 1),
    secret      text CHECK (length(secret) >= 32),
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    secret_key_id text CHECK (length(secret_key_id) BETWEEN 1 AND 32),
    secret_nonce bytea CHECK (length(secret_nonce) = 12),
    secret_ciphertext bytea CHECK (length(secret_ciphertext) BETWEEN 17 AND 1040),
    PRIMARY KEY (merchant_id, id),
    -- A row is in exactly one form at any time.
    CONSTRAINT webhook_endpoints_secret_one_form CHECK (
        (secret IS NULL) = (secret_ciphertext IS NOT NULL)
        AND (secret_ciphertext IS NULL) = (secret_key_id IS NULL)
        AND (secret_ciphertext IS NULL) = (secret_nonce IS NULL))
);
CREATE INDEX webhook_endpoints_list ON webhook_endpoints (merchant_id, created_at DESC);

CREATE TRIGGER webhook_endpoints_no_plaintext BEFORE INSERT OR UPDATE ON webhook_endpoints
    FOR EACH ROW EXECUTE FUNCTION webhook_endpoints_no_plaintext();

CREATE TABLE webhook_deliveries (
    merchant_id     text NOT NULL,
    id              uuid NOT NULL DEFAULT gen_random_uuid(),
    -- The delivery log's order (newest first) and its page token.
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    endpoint_id     uuid NOT NULL,
    event_id        uuid NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- The queue: due when next_attempt_at has passed (NULL: delivered or failed). Claiming pushes it
    -- to the end of the lease, so a worker killed mid-POST leaves a row due again when it runs out.
    next_attempt_at timestamptz,
    lease_owner     text,
    lease_until     timestamptz,
    -- Retries stop here (3 days after the event, or after a manual redelivery): then 'failed'.
    give_up_at      timestamptz NOT NULL,
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (merchant_id, id),
    UNIQUE (merchant_id, endpoint_id, event_id),
    FOREIGN KEY (merchant_id, endpoint_id) REFERENCES webhook_endpoints (merchant_id, id) ON DELETE CASCADE,
    FOREIGN KEY (merchant_id, event_id) REFERENCES merchant_events (merchant_id, id),
    CONSTRAINT webhook_deliveries_lease_whole CHECK ((lease_owner IS NULL) = (lease_until IS NULL)),
    CONSTRAINT webhook_deliveries_pending_is_queued CHECK ((state = 'pending') = (next_attempt_at IS NOT NULL)),
    CONSTRAINT webhook_deliveries_delivered_when CHECK ((state = 'delivered') = (delivered_at IS NOT NULL))
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_log ON webhook_deliveries (merchant_id, endpoint_id, seq DESC);

CREATE TABLE webhook_attempts (
    merchant_id  text NOT NULL,
    delivery_id  uuid NOT NULL,
    attempt      integer NOT NULL CHECK (attempt >= 1),
    worker       text NOT NULL,
    started_at   timestamptz NOT NULL,
    http_status  integer NOT NULL DEFAULT 0,   -- 0: no HTTP answer
    error        text NOT NULL DEFAULT '',
    duration_ms  integer NOT NULL DEFAULT 0,
    PRIMARY KEY (merchant_id, delivery_id, attempt),
    FOREIGN KEY (merchant_id, delivery_id) REFERENCES webhook_deliveries (merchant_id, id) ON DELETE CASCADE
);

-- The outbox writer: the state changes that are events, in the statement that makes them.
CREATE TRIGGER checkouts_merchant_events AFTER UPDATE OF state ON checkouts
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state AND NEW.state IN ('COMPLETED', 'REFUNDED', 'CANCELLED_AFTER_PURCHASE'))
    EXECUTE FUNCTION checkouts_merchant_events();

SELECT cuty_tenant_table('merchant_events');
SELECT cuty_tenant_table('webhook_endpoints');
SELECT cuty_tenant_table('webhook_deliveries');
SELECT cuty_tenant_table('webhook_attempts');

-- `stock.low`, relayed from the code pool's outbox (docs/webhooks-out.md "stock.low: relayed from the
-- code pool"). The code pool writes the event in the statement that changes the stock; the
-- orchestrator's relay (payments/outbound/relay.py) reads it with ListStockEvents(after_seq) and, in
-- one transaction, stores it in merchant_events (ON CONFLICT on its id: a re-read event is stored
-- once), fans it out to the subscribed endpoints and advances its cursor. A crash on either side
-- loses nothing (the cursor moves only with the events it covers) and duplicates nothing (the event id).
--
-- One row per feed the relay reads: how far it has stored. The row is the relay's lock too: a replica
-- relays while it holds the row FOR UPDATE (SKIP LOCKED: the others skip a round), and a replica that
-- dies mid-round drops the lock with its connection. Global (the relay's, across merchants).
CREATE TABLE outbound_feeds (
    feed       text PRIMARY KEY CHECK (feed IN ('codepool.stock')),
    after_seq  bigint NOT NULL DEFAULT 0 CHECK (after_seq >= 0),
    relayed    bigint NOT NULL DEFAULT 0 CHECK (relayed >= 0),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO outbound_feeds (feed) VALUES ('codepool.stock');

CREATE TRIGGER outbound_feeds_forward BEFORE UPDATE ON outbound_feeds FOR EACH ROW
    EXECUTE FUNCTION outbound_feeds_forward();


-- ================================================================================================
-- The operator's read log
-- ================================================================================================
-- Every read by the platform's operator (support, across merchants): who, which RPC, what, whose.
-- Global (the platform's own record, kept whatever merchant was read), append-only.
CREATE TABLE operator_reads (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject     text NOT NULL CHECK (subject <> ''),
    rpc         text NOT NULL,
    object_id   text NOT NULL,
    -- whose object was read (not a tenant key: this table is the platform's, not a merchant's)
    of_merchant text,
    trace_id    text NOT NULL DEFAULT '',
    read_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX operator_reads_by_merchant ON operator_reads (of_merchant, read_at);
CREATE TRIGGER operator_reads_append_only BEFORE UPDATE OR DELETE ON operator_reads
    FOR EACH ROW EXECUTE FUNCTION payment_events_append_only();
