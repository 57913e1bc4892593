-- Codes change status only along the table of codepool.domain.CODE_TRANSITIONS (the same table):
--   available -> reserved -> delivered, reserved -> available (release, expiry);
--   available -> quarantined -> available | revoked (a batch held back, then released or retired);
--   delivered -> revoked (replaced or refunded after a claim); revoked is final.
-- A release (reserved -> available) of a code whose batch is not selling goes where its batch's
-- codes are instead: quarantined (the batch is quarantined) or revoked (retired), so a reservation
-- made before a quarantine is honoured if paid, and its codes never sell again if it is not. The
-- batch's status is read under the batch's shared advisory lock ('codepool.batch:' || id), which
-- the quarantine holds exclusively while it moves the batch's available codes: a release and a
-- quarantine of one batch never pass each other unseen.
-- Status changes stamp their own times (from the database clock); a row changes either its status
-- or its encryption (rotation), never both; identity columns never change, merchant_id included
-- (the tenancy trigger refuses its change too).
CREATE OR REPLACE FUNCTION codes_guard_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    batch_status text;
BEGIN
    IF NEW.id <> OLD.id OR NEW.seq <> OLD.seq OR NEW.product_id <> OLD.product_id OR NEW.batch_id <> OLD.batch_id
       OR NEW.code_hash <> OLD.code_hash OR NEW.created_at <> OLD.created_at OR NEW.merchant_id <> OLD.merchant_id THEN
        RAISE EXCEPTION 'code %: identity columns are immutable', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = OLD.status THEN
        IF NEW.reserved_at IS DISTINCT FROM OLD.reserved_at OR NEW.delivered_at IS DISTINCT FROM OLD.delivered_at
           OR NEW.revoked_at IS DISTINCT FROM OLD.revoked_at THEN
            RAISE EXCEPTION 'code %: reserved_at/delivered_at/revoked_at change only with the status', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.key_id <> OLD.key_id OR NEW.nonce <> OLD.nonce OR NEW.ciphertext <> OLD.ciphertext THEN
        RAISE EXCEPTION 'code %: a status change may not re-encrypt the code', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'reserved' AND NEW.status = 'available' THEN
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('codepool.batch:' || OLD.batch_id::text, 0));
        SELECT b.status INTO batch_status FROM supplier_batches b
         WHERE b.merchant_id = OLD.merchant_id AND b.product_id = OLD.product_id AND b.id = OLD.batch_id;
        IF batch_status = 'quarantined' THEN
            NEW.status := 'quarantined';
        ELSIF batch_status = 'retired' THEN
            NEW.status := 'revoked';
        END IF;
    END IF;
    IF OLD.status = 'available' AND NEW.status = 'reserved' THEN
        NEW.reserved_at := clock_timestamp();
        NEW.delivered_at := NULL;
    ELSIF OLD.status = 'reserved' AND NEW.status = 'delivered' THEN
        NEW.reserved_at := OLD.reserved_at;
        NEW.delivered_at := clock_timestamp();
    ELSIF (OLD.status = 'reserved' AND NEW.status IN ('available', 'quarantined'))
          OR (OLD.status = 'available' AND NEW.status = 'quarantined')
          OR (OLD.status = 'quarantined' AND NEW.status = 'available') THEN
        NEW.reserved_at := NULL;
        NEW.delivered_at := NULL;
    ELSIF (OLD.status IN ('reserved', 'quarantined') AND NEW.status = 'revoked') THEN
        NEW.reserved_at := NULL;
        NEW.delivered_at := NULL;
        NEW.revoked_at := clock_timestamp();
    ELSIF OLD.status = 'delivered' AND NEW.status = 'revoked' THEN
        NEW.reserved_at := OLD.reserved_at;
        NEW.delivered_at := OLD.delivered_at;
        NEW.revoked_at := clock_timestamp();
    ELSE
        RAISE EXCEPTION 'code %: status % -> % is not allowed', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
