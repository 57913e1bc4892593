-- One customer cannot hoard a product's stock (docs/codepool.md, "Per-customer caps"). A customer
-- has at most p_max_active live reservations (reserved and unexpired) and at most p_max_quantity
-- codes of one product reserved at once. Decided here, in the reserving statement's transaction,
-- never by a read-then-write in Python. The caps are per customer, across merchants (customers are
-- global); an existing order item is looked up within the product's merchant, where its unique
-- index is.
--
-- Called by RESERVE (repository.py) before it inserts. VOLATILE on purpose: every statement of a
-- volatile function takes a fresh snapshot, so after the advisory lock the count sees whatever the
-- customer's previous reserving statement committed (the lock is held until commit). One customer's
-- ReserveCodes calls therefore run one at a time; other customers never wait.
-- A replay of an order or order item that already exists is not a new reservation: never capped
-- (the INSERT then does nothing and the caller answers the stored reservation).
CREATE OR REPLACE FUNCTION codepool_customer_cap(p_customer_id text, p_product_id uuid, p_order_id text,
                                                 p_order_item_id text, p_quantity integer, p_max_active integer,
                                                 p_max_quantity integer, p_merchant_id text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_active integer;
    v_quantity bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('codepool.customer:' || p_customer_id, 0));
    IF EXISTS (SELECT FROM reservations r
               WHERE r.order_id = p_order_id OR (r.merchant_id = p_merchant_id AND r.order_item_id = p_order_item_id)) THEN
        RETURN true;
    END IF;
    SELECT count(*), coalesce(sum(r.quantity) FILTER (WHERE r.product_id = p_product_id), 0)
      INTO v_active, v_quantity
      FROM reservations r
     WHERE r.customer_id = p_customer_id AND r.status = 'reserved' AND r.expires_at > clock_timestamp();
    IF v_active >= p_max_active THEN
        RAISE EXCEPTION 'customer has % live reservations, % allowed', v_active, p_max_active
            USING ERRCODE = 'CP002', DETAIL = v_active::text;
    END IF;
    IF v_quantity + p_quantity > p_max_quantity THEN
        RAISE EXCEPTION 'customer has % codes of the product reserved, % more requested, % allowed',
                        v_quantity, p_quantity, p_max_quantity
            USING ERRCODE = 'CP003', DETAIL = v_quantity::text;
    END IF;
    RETURN true;
END $$;
