-- A hold stopped blocking its time (released, expired, a booking cancelled): tell every booking
-- replica, which drops what it remembered of that resource's taken slots (booking/taken.py). The
-- notification is sent at commit, so nobody hears of a change that was rolled back; equal payloads
-- of one transaction arrive once.
CREATE OR REPLACE FUNCTION booking_notify_time_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('booking_time_freed', NEW.resource_id::text);
    RETURN NULL;
END
$$;
