-- Codes change status only along available -> reserved -> delivered and reserved -> available;
-- delivered is final (codepool.domain.CODE_TRANSITIONS is the same table). Status changes stamp their
-- own times (from the database clock); a row changes either its status or its encryption (rotation),
-- never both; identity columns never change, merchant_id included (the tenancy trigger refuses its
-- change too).
CREATE OR REPLACE FUNCTION codes_guard_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id <> OLD.id OR NEW.seq <> OLD.seq OR NEW.product_id <> OLD.product_id OR NEW.batch_id <> OLD.batch_id
       OR NEW.code_hash <> OLD.code_hash OR NEW.created_at <> OLD.created_at OR NEW.merchant_id <> OLD.merchant_id THEN
        RAISE EXCEPTION 'code %: identity columns are immutable', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = OLD.status THEN
        IF NEW.reserved_at IS DISTINCT FROM OLD.reserved_at OR NEW.delivered_at IS DISTINCT FROM OLD.delivered_at THEN
            RAISE EXCEPTION 'code %: reserved_at/delivered_at change only with the status', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.key_id <> OLD.key_id OR NEW.nonce <> OLD.nonce OR NEW.ciphertext <> OLD.ciphertext THEN
        RAISE EXCEPTION 'code %: a status change may not re-encrypt the code', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'available' AND NEW.status = 'reserved' THEN
        NEW.reserved_at := clock_timestamp();
        NEW.delivered_at := NULL;
    ELSIF OLD.status = 'reserved' AND NEW.status = 'delivered' THEN
        NEW.reserved_at := OLD.reserved_at;
        NEW.delivered_at := clock_timestamp();
    ELSIF OLD.status = 'reserved' AND NEW.status = 'available' THEN
        NEW.reserved_at := NULL;
        NEW.delivered_at := NULL;
    ELSE
        RAISE EXCEPTION 'code %: status % -> % is not allowed', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
