-- Retired: the baseline and 0031_payment_events_partitioned declare a trigger on this function, so
-- it exists for them on a database they have not reached; 0160_payment_events_merchant_required
-- drops trigger and function. Every statement appending an event names its merchant itself.
CREATE OR REPLACE FUNCTION payment_events_merchant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NEW;
END $$;
