-- An endpoint's circuit closed (or its open time shortened): its due deliveries may be claimed now,
-- so its merchant's mark is due now (webhook_merchant_due; migration 0310).
CREATE OR REPLACE FUNCTION webhook_endpoints_circuit_closed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhook_merchant_due(NEW.merchant_id, clock_timestamp());
    RETURN NULL;
END $$;
