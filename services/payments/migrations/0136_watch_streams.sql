-- Issue 12, item 5: at most CUTY_MAX_WATCH_STREAMS_PER_USER open WatchCheckout streams per user,
-- across every payments replica (a stream lands on whichever replica the gateway's channel picks,
-- so a count in one process would not bound it). Each open stream holds one numbered place of its
-- user: the primary key (subject, slot) with slot < the cap is the bound, decided by the database.
-- A place is leased: its process renews the lease of all its places in one statement while it
-- runs (payments/checkout/live.py), so a process that died frees its users' places when the lease
-- runs out. The platform's own table (per user, not a merchant's data): no merchant_id.
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
