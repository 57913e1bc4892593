-- Booking: salons, resources (stylists/chairs), slots, and soft holds that never double-book.
-- How the race is decided and how expired holds are taken over: docs/booking.md.

CREATE EXTENSION IF NOT EXISTS btree_gist;

-- IANA names only. Postgres also accepts POSIX strings ('+03' means UTC-3 there!) and
-- abbreviations in AT TIME ZONE, so "Postgres does not raise" is not the test: the name must be in
-- the zone database. The API checks the same with Python's zoneinfo (which renders local times),
-- this check keeps any other writer honest.
CREATE FUNCTION booking_is_iana_zone(tz text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT tz NOT IN ('localtime', 'posixrules', 'Factory')
       AND EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = tz)
$$;

CREATE TABLE salons (
    id         uuid PRIMARY KEY,
    name       text NOT NULL CHECK (btrim(name) <> '' AND length(name) <= 200),
    time_zone  text NOT NULL CHECK (booking_is_iana_zone(time_zone)),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE resources (
    id         uuid PRIMARY KEY,
    salon_id   uuid NOT NULL REFERENCES salons (id),
    name       text NOT NULL CHECK (btrim(name) <> '' AND length(name) <= 200),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- target of slots' composite key: a slot's salon is always its resource's salon
    UNIQUE (salon_id, id)
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
    FOREIGN KEY (salon_id, resource_id) REFERENCES resources (salon_id, id),
    CHECK (end_time > start_time),
    -- the same time offered twice on one chair is a data-entry error. Slots of different
    -- lengths may overlap (a 30 and a 60 minute cut at 10:00); holds can never overlap.
    UNIQUE (resource_id, start_time, end_time)
);
-- ListSlots and the alternatives search walk a salon's slots by time.
CREATE INDEX slots_salon_start ON slots (salon_id, start_time);

-- A hold is the booking itself: 'held' (soft, until expires_at), then 'confirmed' once paid, or
-- 'released' / 'expired'. Its time and price are copied from the slot so the row is the record.
CREATE TABLE holds (
    id           uuid PRIMARY KEY,
    slot_id      uuid NOT NULL REFERENCES slots (id),
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
    CHECK (end_time > start_time),
    CHECK ((status = 'confirmed') = (payment_ref IS NOT NULL)),
    -- Idempotency of HoldSlot: one hold per (customer, request id); a retry returns it.
    UNIQUE (customer_id, request_id),
    -- Invariant 1 (DESIGN.md): no two active holds/bookings of one resource overlap in time.
    -- '[)' ranges, so back-to-back slots touch without overlapping. The predicate cannot say
    -- "and not expired" (it must be immutable), so an expired hold keeps blocking until its status
    -- says so: booking_take_hold() retires overlapping expired holds in the same transaction
    -- before it inserts, and the sweeper retires the rest.
    CONSTRAINT holds_no_overlap EXCLUDE USING gist (resource_id WITH =, during WITH &&)
        WHERE (status IN ('held', 'confirmed'))
);
-- The per-customer cap counts a customer's held rows; the sweeper finds the oldest expired ones.
CREATE INDEX holds_customer_held ON holds (customer_id) WHERE status = 'held';
CREATE INDEX holds_held_expiry ON holds (expires_at) WHERE status = 'held';
CREATE INDEX holds_slot ON holds (slot_id);

-- Expired holds still marked 'held' that overlap [p_start, p_end) on a resource become 'expired',
-- so that the exclusion constraint stops counting them. The rows are locked in id order first:
-- two takers of overlapping slots could otherwise lock the same stale rows in different orders
-- and deadlock. (This lock does not decide any race; the constraint does.)
CREATE FUNCTION booking_retire_stale(p_resource_id uuid, p_start timestamptz, p_end timestamptz,
                                     p_except uuid DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE holds SET status = 'expired', updated_at = clock_timestamp()
     WHERE id IN (SELECT h.id FROM holds h
                   WHERE h.resource_id = p_resource_id
                     AND h.status = 'held'
                     AND h.during && tstzrange(p_start, p_end)
                     AND h.expires_at <= clock_timestamp()
                     AND h.id IS DISTINCT FROM p_except
                   ORDER BY h.id
                     FOR UPDATE)
       AND status = 'held';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- HoldSlot in one round trip (docs/booking.md). Outcomes:
--   'held'           a new hold (the INSERT won against holds_no_overlap)
--   'existing'       this (customer, request id) already has a hold: returned as it is now
--   'request_reused' the request id was used for another slot
--   'slot_not_found', 'slot_started', 'cap' (too many active holds)
--   'taken'          the time is held or booked: up to p_max_alternatives free slots instead
-- The race for the time is decided by the INSERT ... ON CONFLICT DO NOTHING against the exclusion
-- constraint; nothing here reads-then-writes to protect it.
CREATE FUNCTION booking_take_hold(p_hold_id uuid, p_slot_id uuid, p_customer_id text, p_request_id text,
                                  p_ttl_seconds integer, p_max_active integer, p_max_alternatives integer)
RETURNS TABLE (outcome text, hold holds, alternatives slots[], time_zone text, db_now timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_slot   slots;
    v_active integer;
BEGIN
    -- One customer's HoldSlot calls run one at a time (until commit), so the idempotency lookup
    -- and the active-hold count below cannot be raced by that customer's own parallel calls.
    -- Other customers never wait on it. Under READ COMMITTED every statement below takes a fresh
    -- snapshot, so it sees whatever the previous holder of the lock committed.
    PERFORM pg_advisory_xact_lock(hashtextextended('booking.customer:' || p_customer_id, 0));

    SELECT h.* INTO hold FROM holds h WHERE h.customer_id = p_customer_id AND h.request_id = p_request_id;
    IF FOUND THEN
        outcome := CASE WHEN hold.slot_id = p_slot_id THEN 'existing' ELSE 'request_reused' END;
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;
    hold := NULL;

    SELECT s.* INTO v_slot FROM slots s WHERE s.id = p_slot_id;
    IF NOT FOUND THEN
        outcome := 'slot_not_found';
    ELSIF v_slot.start_time <= clock_timestamp() THEN
        outcome := 'slot_started';
    ELSE
        SELECT count(*) INTO v_active FROM holds h
         WHERE h.customer_id = p_customer_id AND h.status = 'held' AND h.expires_at > clock_timestamp();
        IF v_active >= p_max_active THEN
            outcome := 'cap';
        END IF;
    END IF;
    IF outcome IS NOT NULL THEN
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;

    -- An expired hold that nobody swept yet still counts for the constraint: retire it first.
    -- Rows this transaction has updated are invisible to the constraint check of the INSERT.
    PERFORM booking_retire_stale(v_slot.resource_id, v_slot.start_time, v_slot.end_time);

    INSERT INTO holds (id, slot_id, salon_id, resource_id, customer_id, request_id,
                       start_time, end_time, price_minor, currency, expires_at)
    VALUES (p_hold_id, v_slot.id, v_slot.salon_id, v_slot.resource_id, p_customer_id, p_request_id,
            v_slot.start_time, v_slot.end_time, v_slot.price_minor, v_slot.currency,
            clock_timestamp() + make_interval(secs => p_ttl_seconds))
    ON CONFLICT DO NOTHING
    RETURNING * INTO hold;
    db_now := clock_timestamp();
    IF FOUND THEN
        outcome := 'held';
        RETURN NEXT;
        RETURN;
    END IF;

    -- Lost. Offer the nearest free slots of the same length: the same resource first, then the
    -- salon's other resources; the same local day first within each; then by distance in time.
    hold := NULL;
    outcome := 'taken';
    SELECT sa.time_zone INTO time_zone FROM salons sa WHERE sa.id = v_slot.salon_id;
    alternatives := ARRAY(
        SELECT s FROM slots s
         WHERE s.salon_id = v_slot.salon_id
           AND s.id <> v_slot.id
           AND s.start_time > db_now
           -- a bounded window keeps the loser's answer cheap however long the calendar is
           AND s.start_time BETWEEN v_slot.start_time - interval '7 days' AND v_slot.start_time + interval '7 days'
           AND s.end_time - s.start_time = v_slot.end_time - v_slot.start_time
           AND NOT EXISTS (SELECT 1 FROM holds h
                            WHERE h.resource_id = s.resource_id
                              AND h.status IN ('held', 'confirmed')
                              AND h.during && tstzrange(s.start_time, s.end_time)
                              AND (h.status = 'confirmed' OR h.expires_at > db_now))
         ORDER BY s.resource_id <> v_slot.resource_id,
                  (s.start_time AT TIME ZONE time_zone)::date <> (v_slot.start_time AT TIME ZONE time_zone)::date,
                  abs(extract(epoch FROM s.start_time - v_slot.start_time)),
                  s.start_time, s.id
         LIMIT p_max_alternatives);
    RETURN NEXT;
END
$$;

-- ConfirmHold in one round trip. Outcomes: 'confirmed' (also on a retry with the same payment
-- ref), 'reacquired' (it had expired but its time was still free), 'lost' (expired and the time
-- is someone else's now), 'released', 'payment_ref_mismatch', 'not_found'.
CREATE FUNCTION booking_confirm_hold(p_hold_id uuid, p_payment_ref text)
RETURNS TABLE (outcome text, hold holds, db_now timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    FOR attempt IN 1..3 LOOP
        -- A 'held' row is in the constraint's index whether or not its time ran out, so nobody
        -- else can hold that time: confirming it is safe even when it expired a moment ago.
        UPDATE holds h SET status = 'confirmed', payment_ref = p_payment_ref, updated_at = clock_timestamp()
         WHERE h.id = p_hold_id AND h.status = 'held'
        RETURNING h.* INTO hold;
        IF FOUND THEN
            outcome := 'confirmed';
            EXIT;
        END IF;
        SELECT h.* INTO hold FROM holds h WHERE h.id = p_hold_id;
        IF NOT FOUND THEN
            outcome := 'not_found';
            hold := NULL;
            EXIT;
        ELSIF hold.status = 'confirmed' THEN
            outcome := CASE WHEN hold.payment_ref = p_payment_ref THEN 'confirmed' ELSE 'payment_ref_mismatch' END;
            EXIT;
        ELSIF hold.status = 'released' THEN
            outcome := 'released';
            EXIT;
        ELSIF hold.status = 'expired' THEN
            -- Re-acquire: the exclusion constraint decides whether the time is still free.
            PERFORM booking_retire_stale(hold.resource_id, hold.start_time, hold.end_time, hold.id);
            BEGIN
                UPDATE holds h SET status = 'confirmed', payment_ref = p_payment_ref, updated_at = clock_timestamp()
                 WHERE h.id = p_hold_id AND h.status = 'expired'
                RETURNING h.* INTO hold;
                IF FOUND THEN
                    outcome := 'reacquired';
                    EXIT;
                END IF;
            EXCEPTION WHEN exclusion_violation THEN
                outcome := 'lost';
                EXIT;
            END;
        END IF;
        -- the row changed between our statements (a concurrent confirm or takeover): look again
    END LOOP;
    IF outcome IS NULL THEN
        RAISE EXCEPTION 'hold % kept changing under confirm', p_hold_id USING ERRCODE = 'serialization_failure';
    END IF;
    db_now := clock_timestamp();
    RETURN NEXT;
END
$$;
