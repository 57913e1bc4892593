-- Which of a product's counter rows (product_stock.slot) counts a code: a hash of its id (the last
-- byte of a random uuid) modulo the number of slots, 16. Concurrent reservations of one product
-- take different codes, so they mostly update different rows instead of queueing on one row's lock
-- until commit (measured: `make bench-stocklow`, docs/codepool.md "Stock counters").
-- The number is part of the stored data: every row counts the codes of its slot, so changing it
-- takes a numbered migration that recounts product_stock in the same transaction.
CREATE OR REPLACE FUNCTION codepool_stock_slot(p_code_id uuid) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (get_byte(uuid_send(p_code_id), 15) % 16)::smallint
$$;
