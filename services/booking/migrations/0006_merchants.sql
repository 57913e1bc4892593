-- Issue 14: merchants as tenants (docs/tenancy-booking.md). A merchant owns salons; a salon's
-- resources, slots and holds are that merchant's too.
--
-- 1. merchant_id on every table: salons get it from their admin (existing ones: 'default'); the
--    children copy their parent's, and a composite foreign key (merchant_id, parent) -> parent
--    (merchant_id, id) makes any other value impossible. Set at creation, never changed
--    (cuty_tenant_table's trigger).
-- 2. Keys lead with merchant_id, so the tables can be distributed by merchant without weakening a
--    guarantee: the hold request id, the no-overlap exclusion, the slot uniqueness, and the
--    indexes merchant queries walk. Primary keys stay on the random uuids. The per-customer
--    indexes (the active-hold cap) and the sweeper's expiry index stay global: customers book
--    across merchants and the sweeper works for all of them.
-- 3. Row-Level Security on all four tables (cuty_tenant_table, 0000_cuty_tenancy.sql).
-- 4. booking_take_hold reads the slot first and looks the request id up within the slot's merchant;
--    booking_retire_stale and the alternatives search name the merchant so they use the new keys.

ALTER TABLE salons    ADD COLUMN merchant_id text;
ALTER TABLE resources ADD COLUMN merchant_id text;
ALTER TABLE slots     ADD COLUMN merchant_id text;
ALTER TABLE holds     ADD COLUMN merchant_id text;

-- Existing rows: every salon moves into the default merchant, children follow their parents.
UPDATE salons    SET merchant_id = 'default';
UPDATE resources r SET merchant_id = sa.merchant_id FROM salons sa WHERE sa.id = r.salon_id;
UPDATE slots s     SET merchant_id = r.merchant_id FROM resources r WHERE r.id = s.resource_id;
UPDATE holds h     SET merchant_id = s.merchant_id FROM slots s WHERE s.id = h.slot_id;

ALTER TABLE salons    ALTER COLUMN merchant_id SET NOT NULL,
                      ADD CONSTRAINT salons_merchant_id_check CHECK (merchant_id <> '' AND length(merchant_id) <= 200);
ALTER TABLE resources ALTER COLUMN merchant_id SET NOT NULL;
ALTER TABLE slots     ALTER COLUMN merchant_id SET NOT NULL;
ALTER TABLE holds     ALTER COLUMN merchant_id SET NOT NULL;

-- Parents: (merchant_id, id) is the target of their children's keys.
ALTER TABLE salons ADD CONSTRAINT salons_merchant_id_id_key UNIQUE (merchant_id, id);

-- resources -> salons: the merchant is the salon's.
ALTER TABLE resources
    DROP CONSTRAINT resources_salon_id_fkey,
    ADD CONSTRAINT resources_salon_fkey FOREIGN KEY (merchant_id, salon_id) REFERENCES salons (merchant_id, id),
    -- the target of slots' key (replaces UNIQUE (salon_id, id)): a slot's salon and merchant are its chair's
    ADD CONSTRAINT resources_merchant_id_salon_id_id_key UNIQUE (merchant_id, salon_id, id);

-- slots -> resources, and the same time offered twice on one chair, within the merchant.
ALTER TABLE slots
    DROP CONSTRAINT slots_salon_id_resource_id_fkey,
    ADD CONSTRAINT slots_resource_fkey FOREIGN KEY (merchant_id, salon_id, resource_id)
        REFERENCES resources (merchant_id, salon_id, id),
    DROP CONSTRAINT slots_resource_id_start_time_end_time_key,
    ADD CONSTRAINT slots_merchant_id_resource_id_start_time_end_time_key
        UNIQUE (merchant_id, resource_id, start_time, end_time),
    ADD CONSTRAINT slots_merchant_id_id_key UNIQUE (merchant_id, id);
ALTER TABLE resources DROP CONSTRAINT resources_salon_id_id_key;

-- ListSlots and the alternatives search walk a salon's slots by time.
DROP INDEX slots_salon_start;
CREATE INDEX slots_salon_start ON slots (merchant_id, salon_id, start_time);

-- holds -> slots (a hold's merchant is its slot's); HoldSlot's idempotency key and invariant 1,
-- within the merchant (a resource is one merchant's, so no guarantee is weakened).
ALTER TABLE holds
    DROP CONSTRAINT holds_slot_id_fkey,
    ADD CONSTRAINT holds_slot_fkey FOREIGN KEY (merchant_id, slot_id) REFERENCES slots (merchant_id, id),
    DROP CONSTRAINT holds_customer_id_request_id_key,
    ADD CONSTRAINT holds_merchant_id_customer_id_request_id_key UNIQUE (merchant_id, customer_id, request_id),
    DROP CONSTRAINT holds_no_overlap,
    ADD CONSTRAINT holds_no_overlap EXCLUDE USING gist (merchant_id WITH =, resource_id WITH =, during WITH &&)
        WHERE (status IN ('held', 'confirmed'));
-- holds_slot (slot_id) served no query (nothing reads holds by slot; slots are never deleted, so
-- the foreign key never looks holds up). Led by merchant_id it would: with statistics lagging
-- behind a fast-filling table, a cached generic plan took it for the request-id lookup (its one
-- equality on merchant_id looked as good as the unique key's three) and walked all of a merchant's
-- holds on every HoldSlot. Dropped, so that lookup has one index to use.
DROP INDEX holds_slot;

-- The sweeper's index, now only for queries that say `payment_ref IS NULL` (always true of a held
-- hold: CHECK ((status = 'confirmed') = (payment_ref IS NOT NULL))), i.e. the sweeper's. Any query
-- with `status = 'held'` could use the old one, and a generic plan cached while the table was tiny
-- (under ~300 held holds, before autovacuum's first ANALYZE) took it for HoldSlot's per-customer
-- count, which then walked every held hold on every call; the count now has holds_customer_held
-- to itself. Still global: the sweeper works for every merchant.
DROP INDEX holds_held_expiry;
CREATE INDEX holds_held_expiry ON holds (expires_at) WHERE status = 'held' AND payment_ref IS NULL;

SELECT cuty_tenant_table('salons');
SELECT cuty_tenant_table('resources');
SELECT cuty_tenant_table('slots');
SELECT cuty_tenant_table('holds');

-- Expired holds still marked 'held' that overlap [p_start, p_end) on a merchant's resource become
-- 'expired' (0001's function, with the merchant, so the lookup walks holds_no_overlap on all of its
-- columns). The rows are locked in id order first, as before (two takers of overlapping slots must
-- not lock the same stale rows in different orders), then each is updated by its primary key: as
-- one `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE)` a generic plan built while the table's
-- statistics lag behind (a table that filled fast) may walk every held hold instead.
DROP FUNCTION booking_retire_stale(uuid, timestamptz, timestamptz, uuid);

CREATE FUNCTION booking_retire_stale(p_merchant_id text, p_resource_id uuid, p_start timestamptz,
                                     p_end timestamptz, p_except uuid DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n    integer := 0;
    v_id uuid;
BEGIN
    FOR v_id IN SELECT h.id FROM holds h
                 WHERE h.merchant_id = p_merchant_id
                   AND h.resource_id = p_resource_id
                   AND h.status = 'held'
                   AND h.during && tstzrange(p_start, p_end)
                   AND h.expires_at <= clock_timestamp()
                   AND h.id IS DISTINCT FROM p_except
                 ORDER BY h.id
                   FOR UPDATE
    LOOP
        UPDATE holds SET status = 'expired', updated_at = clock_timestamp() WHERE id = v_id AND status = 'held';
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;

-- HoldSlot in one round trip: 0005's function (same outcomes, `taken_over`), except that the slot
-- is read first and the request id is looked up within its merchant (the idempotency key is
-- (merchant_id, customer_id, request_id)); the hold gets the slot's merchant. A retry still
-- answers 'existing' after the slot has started (the lookup comes before that check), and the
-- per-customer lock and cap still span every merchant (customers are global).
DROP FUNCTION booking_take_hold(uuid, uuid, text, text, integer, integer, integer);

CREATE FUNCTION booking_take_hold(p_hold_id uuid, p_slot_id uuid, p_customer_id text, p_request_id text,
                                  p_ttl_seconds integer, p_max_active integer, p_max_alternatives integer)
RETURNS TABLE (outcome text, hold holds, alternatives slots[], time_zone text, db_now timestamptz,
              taken_over integer)
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

    -- A slot is never deleted and never changes merchant, so reading it first is safe.
    SELECT s.* INTO v_slot FROM slots s WHERE s.id = p_slot_id;
    IF NOT FOUND THEN
        outcome := 'slot_not_found';
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;

    SELECT h.* INTO hold FROM holds h
     WHERE h.merchant_id = v_slot.merchant_id AND h.customer_id = p_customer_id AND h.request_id = p_request_id;
    IF FOUND THEN
        outcome := CASE WHEN hold.slot_id = p_slot_id THEN 'existing' ELSE 'request_reused' END;
        db_now := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;
    hold := NULL;

    IF v_slot.start_time <= clock_timestamp() THEN
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
    taken_over := booking_retire_stale(v_slot.merchant_id, v_slot.resource_id, v_slot.start_time, v_slot.end_time);

    INSERT INTO holds (id, merchant_id, slot_id, salon_id, resource_id, customer_id, request_id,
                       start_time, end_time, price_minor, currency, expires_at)
    VALUES (p_hold_id, v_slot.merchant_id, v_slot.id, v_slot.salon_id, v_slot.resource_id, p_customer_id,
            p_request_id, v_slot.start_time, v_slot.end_time, v_slot.price_minor, v_slot.currency,
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
    SELECT sa.time_zone INTO time_zone FROM salons sa
     WHERE sa.merchant_id = v_slot.merchant_id AND sa.id = v_slot.salon_id;
    alternatives := ARRAY(
        SELECT s FROM slots s
         WHERE s.merchant_id = v_slot.merchant_id
           AND s.salon_id = v_slot.salon_id
           AND s.id <> v_slot.id
           AND s.start_time > db_now
           -- a bounded window keeps the loser's answer cheap however long the calendar is
           AND s.start_time BETWEEN v_slot.start_time - interval '7 days' AND v_slot.start_time + interval '7 days'
           AND s.end_time - s.start_time = v_slot.end_time - v_slot.start_time
           -- OFFSET 0 keeps this a per-slot probe of holds_no_overlap on all three of its columns.
           -- As a join, the planner may derive h.merchant_id = (the slot's merchant) and, when its
           -- statistics lag behind a table filling fast, scan all of the merchant's holds once per slot.
           AND NOT EXISTS (SELECT 1 FROM holds h
                            WHERE h.merchant_id = s.merchant_id
                              AND h.resource_id = s.resource_id
                              AND h.status IN ('held', 'confirmed')
                              AND h.during && tstzrange(s.start_time, s.end_time)
                              AND (h.status = 'confirmed' OR h.expires_at > db_now)
                           OFFSET 0)
         ORDER BY s.resource_id <> v_slot.resource_id,
                  (s.start_time AT TIME ZONE time_zone)::date <> (v_slot.start_time AT TIME ZONE time_zone)::date,
                  abs(extract(epoch FROM s.start_time - v_slot.start_time)),
                  s.start_time, s.id
         LIMIT p_max_alternatives);
    RETURN NEXT;
END
$$;

-- ConfirmHold: 0002's function; only the call of booking_retire_stale names the hold's merchant.
CREATE OR REPLACE FUNCTION booking_confirm_hold(p_hold_id uuid, p_payment_ref text, p_cutoff_seconds double precision DEFAULT 0)
RETURNS TABLE (outcome text, hold holds, db_now timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    FOR attempt IN 1..3 LOOP
        -- A 'held' row is in the constraint's index whether or not its time ran out, so nobody
        -- else can hold that time: confirming it is safe even when it expired a moment ago.
        UPDATE holds h SET status = 'confirmed', payment_ref = p_payment_ref, updated_at = clock_timestamp()
         WHERE h.id = p_hold_id AND h.status = 'held'
           AND h.start_time > clock_timestamp() + make_interval(secs => p_cutoff_seconds)
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
        ELSIF hold.start_time <= clock_timestamp() + make_interval(secs => p_cutoff_seconds) THEN
            -- held or expired, and too late: the appointment has started (or is about to)
            outcome := 'started';
            EXIT;
        ELSIF hold.status = 'expired' THEN
            -- Re-acquire: the exclusion constraint decides whether the time is still free.
            PERFORM booking_retire_stale(hold.merchant_id, hold.resource_id, hold.start_time, hold.end_time, hold.id);
            BEGIN
                UPDATE holds h SET status = 'confirmed', payment_ref = p_payment_ref, updated_at = clock_timestamp()
                 WHERE h.id = p_hold_id AND h.status = 'expired'
                   AND h.start_time > clock_timestamp() + make_interval(secs => p_cutoff_seconds)
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
