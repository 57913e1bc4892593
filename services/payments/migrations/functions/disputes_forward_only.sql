-- A dispute only moves forward: needs_response -> under_review -> won | lost (needs_response -> won |
-- lost too); closed is final. Its payment, PSP id and amount never change; the evidence, once
-- submitted, is never replaced.
CREATE OR REPLACE FUNCTION disputes_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
        (OLD.status = 'needs_response' AND NEW.status IN ('under_review', 'won', 'lost'))
        OR (OLD.status = 'under_review' AND NEW.status IN ('won', 'lost'))) THEN
        RAISE EXCEPTION 'dispute % may not move from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF (NEW.payment_id, NEW.psp_dispute_id, NEW.amount_minor, NEW.currency) IS DISTINCT FROM
       (OLD.payment_id, OLD.psp_dispute_id, OLD.amount_minor, OLD.currency)
       OR (OLD.evidence IS NOT NULL AND NEW.evidence IS DISTINCT FROM OLD.evidence) THEN
        RAISE EXCEPTION 'dispute % is immutable but for its status and (once) its evidence', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
