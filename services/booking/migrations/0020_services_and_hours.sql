-- A salon's real day (docs/booking.md, "Services and working hours"): services of a length, by the
-- resources able to do them, inside each resource's working hours; bookable times are computed
-- (booking_service_times), not stored. A time is held through a service slot: a slots row bound to
-- the service, made on demand by booking_service_slot (resource NULL: "any able resource", chosen
-- when the hold is taken). The race is still decided by holds_no_overlap, now over the hold's time
-- with its service's buffers.

-- Settings: the least notice a booking needs, how far ahead it may be, and the grid of start times.
ALTER TABLE salons
    ADD COLUMN min_notice_minutes   integer NOT NULL DEFAULT 60 CHECK (min_notice_minutes BETWEEN 0 AND 43200),
    ADD COLUMN booking_horizon_days integer NOT NULL DEFAULT 90 CHECK (booking_horizon_days BETWEEN 1 AND 730),
    ADD COLUMN time_step_minutes    integer NOT NULL DEFAULT 15 CHECK (time_step_minutes IN (5, 10, 15, 20, 30, 60));

CREATE TABLE services (
    id                    uuid PRIMARY KEY,
    salon_id              uuid NOT NULL,
    merchant_id           text NOT NULL,
    name                  text NOT NULL CHECK (btrim(name) <> '' AND length(name) <= 200),
    duration_minutes      integer NOT NULL CHECK (duration_minutes BETWEEN 5 AND 1440),
    buffer_before_minutes integer NOT NULL DEFAULT 0 CHECK (buffer_before_minutes BETWEEN 0 AND 240),
    buffer_after_minutes  integer NOT NULL DEFAULT 0 CHECK (buffer_after_minutes BETWEEN 0 AND 240),
    price_minor           bigint NOT NULL CHECK (price_minor BETWEEN 0 AND 100000000),
    currency              text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT services_salon_fkey FOREIGN KEY (merchant_id, salon_id) REFERENCES salons (merchant_id, id),
    CONSTRAINT services_merchant_id_salon_id_id_key UNIQUE (merchant_id, salon_id, id)
);

-- Which resources can perform a service (both of one salon, by the composite keys).
CREATE TABLE service_resources (
    merchant_id text NOT NULL,
    salon_id    uuid NOT NULL,
    service_id  uuid NOT NULL,
    resource_id uuid NOT NULL,
    PRIMARY KEY (merchant_id, service_id, resource_id),
    CONSTRAINT service_resources_service_fkey FOREIGN KEY (merchant_id, salon_id, service_id)
        REFERENCES services (merchant_id, salon_id, id),
    CONSTRAINT service_resources_resource_fkey FOREIGN KEY (merchant_id, salon_id, resource_id)
        REFERENCES resources (merchant_id, salon_id, id)
);

-- Weekly hours per resource, wall-clock times in the salon's zone. `closes <= opens` means the
-- interval closes on the next day (a night shift); closes '24:00' is midnight. An interval belongs
-- to the day it opens on: that day's override replaces it.
CREATE TABLE working_hours (
    merchant_id text NOT NULL,
    salon_id    uuid NOT NULL,
    resource_id uuid NOT NULL,
    weekday     smallint NOT NULL CHECK (weekday BETWEEN 1 AND 7),  -- ISO: 1 Monday .. 7 Sunday
    opens       time NOT NULL,
    closes      time NOT NULL,
    CHECK (opens <> closes AND opens < '24:00'),
    PRIMARY KEY (merchant_id, resource_id, weekday, opens),
    CONSTRAINT working_hours_resource_fkey FOREIGN KEY (merchant_id, salon_id, resource_id)
        REFERENCES resources (merchant_id, salon_id, id)
);
CREATE INDEX working_hours_salon ON working_hours (merchant_id, salon_id, weekday);

-- Date overrides: for one local day of one resource (resource_id) or of the whole salon (NULL),
-- special hours (rows with opens/closes) or a day off (one row, opens and closes NULL). A
-- resource's own override of a day beats the salon's, which beats the weekly hours.
CREATE TABLE hours_overrides (
    id          uuid PRIMARY KEY,
    merchant_id text NOT NULL,
    salon_id    uuid NOT NULL,
    resource_id uuid,
    day         date NOT NULL,
    opens       time,
    closes      time,
    CHECK ((opens IS NULL) = (closes IS NULL)),
    CHECK (opens IS NULL OR (opens <> closes AND opens < '24:00')),
    CONSTRAINT hours_overrides_salon_fkey FOREIGN KEY (merchant_id, salon_id) REFERENCES salons (merchant_id, id),
    CONSTRAINT hours_overrides_resource_fkey FOREIGN KEY (merchant_id, salon_id, resource_id)
        REFERENCES resources (merchant_id, salon_id, id)
);
CREATE INDEX hours_overrides_day ON hours_overrides (merchant_id, salon_id, day);

-- Service slots: a slot of a service (its length and price), on a named resource or, with
-- resource_id NULL, on whichever able resource the hold takes. Made on demand, one per (service,
-- resource or any, start): NULLS NOT DISTINCT so the "any" slot is unique too. Plain slots keep
-- their uniqueness of (resource, start, end).
ALTER TABLE slots ADD COLUMN service_id uuid,
    ALTER COLUMN resource_id DROP NOT NULL,
    ADD CONSTRAINT slots_service_fkey FOREIGN KEY (merchant_id, salon_id, service_id)
        REFERENCES services (merchant_id, salon_id, id),
    ADD CONSTRAINT slots_resource_or_service CHECK (resource_id IS NOT NULL OR service_id IS NOT NULL),
    DROP CONSTRAINT slots_merchant_id_resource_id_start_time_end_time_key,
    ADD CONSTRAINT slots_merchant_id_resource_id_start_time_end_time_key
        UNIQUE NULLS NOT DISTINCT (merchant_id, resource_id, start_time, end_time, service_id);

-- Holds of a service carry its buffers: the resource is blocked from start - buffer_before until
-- end + buffer_after, and holds_no_overlap is over that time. A generated column's expression
-- cannot be altered, so `during` and the constraint over it are made again.
-- `offered`: a short hold taken for a customer who lost a race, on the first alternative; their
-- next HoldSlot of that slot adopts it (booking_take_hold).
ALTER TABLE holds
    ADD COLUMN service_id uuid,
    ADD COLUMN buffer_before_minutes integer NOT NULL DEFAULT 0 CHECK (buffer_before_minutes BETWEEN 0 AND 240),
    ADD COLUMN buffer_after_minutes  integer NOT NULL DEFAULT 0 CHECK (buffer_after_minutes BETWEEN 0 AND 240),
    ADD COLUMN offered boolean NOT NULL DEFAULT false,
    DROP CONSTRAINT holds_no_overlap,
    DROP COLUMN during;
ALTER TABLE holds
    ADD COLUMN during tstzrange GENERATED ALWAYS AS (
        booking_blocked_range(start_time, end_time, buffer_before_minutes, buffer_after_minutes)) STORED,
    ADD CONSTRAINT holds_no_overlap EXCLUDE USING gist (merchant_id WITH =, resource_id WITH =, during WITH &&)
        WHERE (status IN ('held', 'confirmed'));

SELECT cuty_tenant_table('services');
SELECT cuty_tenant_table('service_resources');
SELECT cuty_tenant_table('working_hours');
SELECT cuty_tenant_table('hours_overrides');
