-- Issue 12: lists of checkouts (ListCheckouts, docs/checkout.md "Lists").
--
-- 1. The salon of a booking, recorded with its hold and its merchant by the saga's TRANSITION
--    (`salon_id = COALESCE(salon_id, $n)`, from booking's Hold.salon_id). Checkouts held before this
--    migration keep NULL (the salon filter does not find them); code purchases have none.
-- 2. The lists' indexes, newest first with the id as tie-break (the keyset of the page tokens):
--    staff and admins' lists lead with merchant_id (docs/tenancy.md), one per filter that narrows
--    a merchant's list by a column; the customer's list by customer (customers are global); the
--    operator's across merchants by time alone.
ALTER TABLE checkouts ADD COLUMN salon_id uuid;

CREATE INDEX checkouts_merchant_list ON checkouts (merchant_id, created_at DESC, id DESC)
    WHERE merchant_id IS NOT NULL;
CREATE INDEX checkouts_merchant_salon ON checkouts (merchant_id, salon_id, created_at DESC, id DESC)
    WHERE salon_id IS NOT NULL;
CREATE INDEX checkouts_merchant_product ON checkouts (merchant_id, product_id, created_at DESC, id DESC)
    WHERE product_id IS NOT NULL;
CREATE INDEX checkouts_customer_list ON checkouts (customer_id, created_at DESC, id DESC);
CREATE INDEX checkouts_list ON checkouts (created_at DESC, id DESC);
-- (merchant_id, created_at) of 0120 is covered by checkouts_merchant_list.
DROP INDEX checkouts_by_merchant;
