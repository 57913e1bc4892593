-- The same forward-only table as payments/domain.py (TRANSITIONS), so a regression is refused by the
-- database whatever code wrote it; a status change must also bump the version by exactly one. A
-- captured payment is refunded in part (partially_refunded) or in full (refunded).
CREATE OR REPLACE FUNCTION payments_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version <> OLD.version AND NEW.version <> OLD.version + 1 THEN
        RAISE EXCEPTION 'payment % version must rise by one, % -> %', OLD.id, OLD.version, NEW.version
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        IF NEW.version <> OLD.version + 1 THEN
            RAISE EXCEPTION 'payment % status change without a version bump', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NOT (
            (OLD.status = 'created' AND NEW.status IN ('requires_action', 'processing', 'succeeded', 'failed', 'canceled'))
            OR (OLD.status = 'requires_action' AND NEW.status IN ('processing', 'succeeded', 'failed', 'canceled'))
            OR (OLD.status = 'processing' AND NEW.status IN ('succeeded', 'failed', 'canceled'))
            OR (OLD.status = 'succeeded' AND NEW.status IN ('partially_refunded', 'refunded'))
            OR (OLD.status = 'partially_refunded' AND NEW.status = 'refunded')
        ) THEN
            RAISE EXCEPTION 'payment % may not move from % to %', OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
