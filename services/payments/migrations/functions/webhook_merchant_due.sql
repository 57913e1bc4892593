-- Marks a merchant's deliveries as possibly claimable from `p_at` on (webhook_merchants_due,
-- migration 0310): afterwards the merchant's mark is due no later than `p_at` (or now, if that is
-- later) and held FOR SHARE until this transaction ends, so no delivery worker moves it later or
-- removes it before this transaction's deliveries are visible to it. Writers of one merchant share
-- the lock and do not wait for each other; only a mark due later than `p_at` (its merchant had only
-- retries to come) is updated. A worker that moved or removed the mark between two of these
-- statements makes it try again, a few times at the most.
--
-- A transaction holds the mark FOR SHARE only while it is due, never on the way to updating it.
-- FOR SHARE locks the newest version of a row that a worker changed meanwhile before it re-checks
-- the condition, and keeps that lock when the re-check fails (the worker moved the mark later). Two
-- writers left holding it so would each wait for the other's share to update it: a deadlock. The
-- probe runs in a block of its own, undone (its lock with it) when it finds nothing due.
CREATE OR REPLACE FUNCTION webhook_merchant_due(p_merchant_id text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    FOR attempt IN 1..20 LOOP
        BEGIN
            PERFORM 1 FROM webhook_merchants_due
            WHERE merchant_id = p_merchant_id AND due_at <= greatest(p_at, clock_timestamp()) FOR SHARE;
            IF FOUND THEN
                RETURN;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'CU001';  -- nothing due: undo the probe, its lock too
        EXCEPTION WHEN SQLSTATE 'CU001' THEN
            NULL;
        END;
        UPDATE webhook_merchants_due SET due_at = p_at WHERE merchant_id = p_merchant_id AND due_at > p_at;
        IF FOUND THEN
            RETURN;
        END IF;
        INSERT INTO webhook_merchants_due (merchant_id, due_at) VALUES (p_merchant_id, p_at) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'webhook_merchants_due: merchant %''s mark kept changing', p_merchant_id
        USING ERRCODE = 'serialization_failure';
END $$;
