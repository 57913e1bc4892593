-- Booking replicas answer the losers of a hot slot from memory while they know it is blocked
-- (booking/taken.py); this trigger tells them when a hold stops blocking its time. Only a change
-- out of the blocking statuses fires it: HoldSlot's INSERT and ConfirmHold pay nothing.
CREATE TRIGGER holds_time_freed AFTER UPDATE OF status ON holds
    FOR EACH ROW
    WHEN (OLD.status IN ('held', 'confirmed') AND NEW.status IN ('released', 'expired'))
    EXECUTE FUNCTION booking_notify_time_freed();
