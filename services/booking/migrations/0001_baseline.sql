-- Booking: salons, resources (stylists/chairs), slots, and soft holds that never double-book.
-- How the race is decided and how expired holds are taken over: docs/booking.md. The functions
-- (booking_take_hold, booking_confirm_hold, booking_retire_stale, booking_is_iana_zone) are in
-- functions/.
--
-- Merchants as tenants (docs/tenancy.md, "Booking"): a merchant owns salons; a salon's resources,
-- slots and holds are that merchant's too.
-- 1. merchant_id on every table: a salon gets it from its admin; the children copy their parent's,
--    and a composite foreign key (merchant_id, parent) -> parent (merchant_id, id) makes any other
--    value impossible. Set at creation, never changed (cuty_tenant_table's trigger).
-- 2. Keys lead with merchant_id, so the tables can be distributed by merchant without weakening a
--    guarantee: the hold request id, the no-overlap exclusion, the slot uniqueness, and the
--    indexes merchant queries walk. Primary keys stay on the random uuids. The per-customer
--    indexes (the active-hold cap) and the sweeper's expiry index stay global: customers book
--    across merchants and the sweeper works for all of them.
-- 3. Row-Level Security on all four tables (cuty_tenant_table).

CREATE EXTENSION IF NOT EXISTS btree_gist;

-- Cancellation policy (docs/booking.md, "Cancellation policy"):
-- free_cancellation_hours N (>= 0): a booking is cancelled free (full refund) until N hours before
-- its start; elapsed hours, i.e. the instant start_time - N * 1 hour, not a wall-clock time (a
-- salon whose clocks spring forward in between still gets N real hours). After that the fee
-- cancellation_fee_percent (0..100) of what was paid is kept. Defaults: 24 hours, 0 %.
CREATE TABLE salons (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CHECK (btrim(name) <> '' AND length(name) <= 200),
    time_zone   text NOT NULL CHECK (booking_is_iana_zone(time_zone)),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id text NOT NULL CHECK (merchant_id <> '' AND length(merchant_id) <= 200),
    free_cancellation_hours  integer NOT NULL DEFAULT 24 CHECK (free_cancellation_hours BETWEEN 0 AND 8760),
    cancellation_fee_percent integer NOT NULL DEFAULT 0 CHECK (cancellation_fee_percent BETWEEN 0 AND 100),
    -- the target of the resources' key
    CONSTRAINT salons_merchant_id_id_key UNIQUE (merchant_id, id)
);

CREATE TABLE resources (
    id          uuid PRIMARY KEY,
    salon_id    uuid NOT NULL,
    name        text NOT NULL CHECK (btrim(name) <> '' AND length(name) <= 200),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id text NOT NULL,
    -- the merchant is the salon's
    CONSTRAINT resources_salon_fkey FOREIGN KEY (merchant_id, salon_id) REFERENCES salons (merchant_id, id),
    -- the target of slots' key: a slot's salon and merchant are always its chair's
    CONSTRAINT resources_merchant_id_salon_id_id_key UNIQUE (merchant_id, salon_id, id)
);

CREATE TABLE slots (
    id          uuid PRIMARY KEY,
    salon_id    uuid NOT NULL,
    resource_id uuid NOT NULL,
    start_time  timestamptz NOT NULL,
    end_time    timestamptz NOT NULL,
    price_minor bigint NOT NULL CHECK (price_minor >= 0),
    -- shape only; the API checks membership in its ISO 4217 list
    currency    text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id text NOT NULL,
    CONSTRAINT slots_resource_fkey FOREIGN KEY (merchant_id, salon_id, resource_id)
        REFERENCES resources (merchant_id, salon_id, id),
    CHECK (end_time > start_time),
    -- the same time offered twice on one chair is a data-entry error. Slots of different
    -- lengths may overlap (a 30 and a 60 minute cut at 10:00); holds can never overlap.
    CONSTRAINT slots_merchant_id_resource_id_start_time_end_time_key
        UNIQUE (merchant_id, resource_id, start_time, end_time),
    -- the target of the holds' key
    CONSTRAINT slots_merchant_id_id_key UNIQUE (merchant_id, id)
);
-- ListSlots and the alternatives search walk a salon's slots by time.
CREATE INDEX slots_salon_start ON slots (merchant_id, salon_id, start_time);

-- A hold is the booking itself: 'held' (soft, until expires_at), then 'confirmed' once paid, or
-- 'released' / 'expired'. Its time and price are copied from the slot so the row is the record,
-- and so is its salon's cancellation policy when it was taken (copied by booking_take_hold). A
-- confirmed hold cancelled after purchase (CancelBooking) becomes 'released' (its time bookable
-- again), remembering when and which payment it was booked with.
CREATE TABLE holds (
    id           uuid PRIMARY KEY,
    slot_id      uuid NOT NULL,
    salon_id     uuid NOT NULL,
    resource_id  uuid NOT NULL,
    customer_id  text NOT NULL CHECK (customer_id <> ''),
    request_id   text NOT NULL CHECK (request_id <> ''),
    status       text NOT NULL DEFAULT 'held'
                 CHECK (status IN ('held', 'confirmed', 'released', 'expired')),
    start_time   timestamptz NOT NULL,
    end_time     timestamptz NOT NULL,
    during       tstzrange GENERATED ALWAYS AS (tstzrange(start_time, end_time)) STORED,
    price_minor  bigint NOT NULL,
    currency     text NOT NULL,
    expires_at   timestamptz NOT NULL,
    extended     boolean NOT NULL DEFAULT false,
    payment_ref  text,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    merchant_id  text NOT NULL,
    free_cancellation_hours  integer NOT NULL DEFAULT 24 CHECK (free_cancellation_hours BETWEEN 0 AND 8760),
    cancellation_fee_percent integer NOT NULL DEFAULT 0 CHECK (cancellation_fee_percent BETWEEN 0 AND 100),
    cancelled_at          timestamptz,
    cancelled_payment_ref text,
    -- a hold's merchant is its slot's
    CONSTRAINT holds_slot_fkey FOREIGN KEY (merchant_id, slot_id) REFERENCES slots (merchant_id, id),
    CHECK (end_time > start_time),
    CHECK ((status = 'confirmed') = (payment_ref IS NOT NULL)),
    CONSTRAINT holds_cancelled_whole CHECK (
        (cancelled_at IS NULL) = (cancelled_payment_ref IS NULL)
        AND (cancelled_at IS NULL OR status = 'released')),
    -- Idempotency of HoldSlot: one hold per (customer, request id) within the slot's merchant; a
    -- retry returns it.
    CONSTRAINT holds_merchant_id_customer_id_request_id_key UNIQUE (merchant_id, customer_id, request_id),
    -- Invariant 1 (docs/architecture.md): no two active holds/bookings of one resource overlap in time (a
    -- resource is one merchant's, so leading with merchant_id weakens nothing). '[)' ranges, so
    -- back-to-back slots touch without overlapping. The predicate cannot say "and not expired" (it
    -- must be immutable), so an expired hold keeps blocking until its status says so:
    -- booking_take_hold() retires overlapping expired holds in the same transaction before it
    -- inserts, and the sweeper retires the rest.
    CONSTRAINT holds_no_overlap EXCLUDE USING gist (merchant_id WITH =, resource_id WITH =, during WITH &&)
        WHERE (status IN ('held', 'confirmed'))
);
-- The per-customer cap counts a customer's held rows.
CREATE INDEX holds_customer_held ON holds (customer_id) WHERE status = 'held';
-- The sweeper finds the oldest expired holds. Only for queries that say `payment_ref IS NULL`
-- (always true of a held hold: CHECK ((status = 'confirmed') = (payment_ref IS NOT NULL))), i.e.
-- the sweeper's: with just `status = 'held'`, a generic plan cached while the table was tiny
-- (under ~300 held holds, before autovacuum's first ANALYZE) took it for HoldSlot's per-customer
-- count, which then walked every held hold on every call; the count has holds_customer_held to
-- itself. Global: the sweeper works for every merchant.
-- There is deliberately no index on holds (slot_id): nothing reads holds by slot (slots are never
-- deleted, so the foreign key never looks holds up), and led by merchant_id, a cached generic plan
-- built while the statistics lagged behind a fast-filling table took it for the request-id lookup
-- (its one equality on merchant_id looked as good as the unique key's three) and walked all of a
-- merchant's holds on every HoldSlot.
CREATE INDEX holds_held_expiry ON holds (expires_at) WHERE status = 'held' AND payment_ref IS NULL;
-- A salon's agenda (ListBookings, docs/booking.md): the holds of a salon's resources that start
-- within one local day, in (start_time, resource_id, id) order. Led by merchant_id like every
-- merchant key (docs/tenancy.md), then the salon (which no hold-path query names), and partial on
-- the statuses the agenda shows (released and expired holds are most of the table in time).
CREATE INDEX holds_agenda ON holds (merchant_id, salon_id, start_time, resource_id, id)
    WHERE status IN ('held', 'confirmed');

SELECT cuty_tenant_table('salons');
SELECT cuty_tenant_table('resources');
SELECT cuty_tenant_table('slots');
SELECT cuty_tenant_table('holds');
