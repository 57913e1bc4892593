-- Issue 12: a salon's agenda (ListBookings, docs/booking.md): the holds of a salon's resources that
-- start within one local day, in (start_time, resource_id, id) order. Led by merchant_id like every
-- merchant key (docs/tenancy.md), then the salon (which no hold-path query names), and partial on
-- the statuses the agenda shows (released and expired holds are most of the table in time).
CREATE INDEX holds_agenda ON holds (merchant_id, salon_id, start_time, resource_id, id)
    WHERE status IN ('held', 'confirmed');
