"""Outbound events for merchants (docs/webhooks-out.md): the transactional
outbox (merchant_events, written by a trigger on checkouts, checkouts_merchant_events), the endpoints a
merchant's admins register, and the delivery workers that POST signed events at least once."""
