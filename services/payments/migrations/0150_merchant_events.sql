-- Issue 12, item 6: outbound events for merchants (docs/webhooks-out.md).
--
-- 1. merchant_events, the transactional outbox: written by a trigger on checkouts in the statement
--    (so the transaction) that changes the state. No state change without its event and no event
--    without its state change, by construction: both commit or neither does.
-- 2. webhook_endpoints: registered by a merchant's admins (WebhookEndpointService).
-- 3. webhook_deliveries: one row per (event, subscribed endpoint), fanned out by the same trigger,
--    so no crash can fall between the event and its deliveries; delivery workers claim due rows
--    with FOR UPDATE SKIP LOCKED and a lease (payments/outbound/worker.py).
-- 4. webhook_attempts: the delivery log, one row per HTTP attempt.
-- Every table is a merchant's (cuty_tenant_table), keys lead with merchant_id.

CREATE TABLE merchant_events (
    merchant_id text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    id          uuid NOT NULL DEFAULT gen_random_uuid(),
    type        text NOT NULL CHECK (type IN ('checkout.completed', 'booking.confirmed', 'codes.delivered',
                                              'checkout.refunded')),
    checkout_id uuid,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (merchant_id, id)
);
CREATE INDEX merchant_events_checkout ON merchant_events (merchant_id, checkout_id);
-- An event is history: never changed, never deleted.
CREATE TRIGGER merchant_events_append_only BEFORE UPDATE OR DELETE ON merchant_events
    FOR EACH ROW EXECUTE FUNCTION payment_events_append_only();

CREATE TABLE webhook_endpoints (
    merchant_id text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    id          uuid NOT NULL,
    url         text NOT NULL CHECK (length(url) BETWEEN 8 AND 2048),
    events      text[] NOT NULL CHECK (cardinality(events) >= 1),
    -- The HMAC key of Cuty-Signature. Stored as is: signing needs the key itself (a hash would not
    -- do); see docs/webhooks-out.md "Secrets" for the decision. Never returned after creation.
    secret      text NOT NULL CHECK (length(secret) >= 32),
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (merchant_id, id)
);
CREATE INDEX webhook_endpoints_list ON webhook_endpoints (merchant_id, created_at DESC);

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
CREATE FUNCTION checkouts_merchant_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    types  text[];
    t      text;
    ev_id  uuid;
    ev_at  timestamptz;
BEGIN
    IF NEW.state = 'COMPLETED' THEN
        types := ARRAY['checkout.completed',
                       CASE NEW.kind WHEN 'booking' THEN 'booking.confirmed' ELSE 'codes.delivered' END];
    ELSIF NEW.state = 'REFUNDED' THEN
        types := ARRAY['checkout.refunded'];
    ELSE
        RETURN NULL;
    END IF;
    IF NEW.merchant_id IS NULL THEN  -- impossible past HELD (checkouts_held_has_merchant)
        RETURN NULL;
    END IF;
    FOREACH t IN ARRAY types LOOP
        ev_id := gen_random_uuid();
        ev_at := clock_timestamp();
        INSERT INTO merchant_events (merchant_id, id, type, checkout_id, payload, created_at)
        VALUES (NEW.merchant_id, ev_id, t, NEW.id, jsonb_build_object(
            'id', ev_id,
            'type', t,
            'created', to_char(ev_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'merchant_id', NEW.merchant_id,
            'data', jsonb_build_object('checkout', jsonb_strip_nulls(jsonb_build_object(
                'id', NEW.id,
                'kind', NEW.kind,
                'state', NEW.state,
                'amount', jsonb_build_object('amount_minor', NEW.amount_minor, 'currency_code', NEW.currency),
                'slot_id', NEW.slot_id,
                'salon_id', NEW.salon_id,
                'product_id', NEW.product_id,
                'quantity', CASE WHEN NEW.kind = 'codes' THEN NEW.quantity END,
                'hold_id', NEW.hold_id,
                'order_id', NEW.order_id,
                'payment_id', NEW.payment_id,
                'create_time', to_char(NEW.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))))),
            ev_at);
        INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, next_attempt_at, give_up_at, created_at)
        SELECT NEW.merchant_id, w.id, ev_id, ev_at, ev_at + interval '3 days', ev_at
        FROM webhook_endpoints w
        WHERE w.merchant_id = NEW.merchant_id AND t = ANY (w.events);
    END LOOP;
    -- Wakes the delivery workers of every replica at commit (polling is the safety net).
    PERFORM pg_notify('cuty_merchant_events', NEW.merchant_id);
    RETURN NULL;
END $$;

CREATE TRIGGER checkouts_merchant_events AFTER UPDATE OF state ON checkouts
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state AND NEW.state IN ('COMPLETED', 'REFUNDED'))
    EXECUTE FUNCTION checkouts_merchant_events();

SELECT cuty_tenant_table('merchant_events');
SELECT cuty_tenant_table('webhook_endpoints');
SELECT cuty_tenant_table('webhook_deliveries');
SELECT cuty_tenant_table('webhook_attempts');
