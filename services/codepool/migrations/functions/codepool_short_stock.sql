-- ReserveCodes is one autocommit statement (repository.RESERVE); when it could take fewer codes
-- than ordered it calls this, so the statement and everything it inserted is undone: all or nothing
-- without a BEGIN/COMMIT round trip on the hot path.
CREATE OR REPLACE FUNCTION codepool_short_stock(requested int, taken bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'out of stock: % codes requested, % could be taken', requested, taken
        USING ERRCODE = 'CP001';
END $$;
