-- A refund's status only moves forward: pending -> succeeded | failed; but for its status a refund
-- never changes.
CREATE OR REPLACE FUNCTION refunds_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND OLD.status <> 'pending' THEN
        RAISE EXCEPTION 'refund % may not move from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF (NEW.amount_minor, NEW.payment_id, NEW.merchant_id, NEW.key) IS DISTINCT FROM
       (OLD.amount_minor, OLD.payment_id, OLD.merchant_id, OLD.key) THEN
        RAISE EXCEPTION 'refund % is immutable but for its status', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
