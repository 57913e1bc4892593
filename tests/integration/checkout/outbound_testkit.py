"""What the outbox's integration tests share (their fixtures `endpoints` and `clean_endpoints` are
in conftest.py): delivery workers fast enough for tests, allowed to reach the local receivers
(CUTY_WEBHOOK_ALLOW_PRIVATE's setting), with a circuit breaker that closes again within tests."""
from __future__ import annotations

from payments.outbound.worker import DeliveryOptions

FAST = DeliveryOptions(poll_seconds=0.05, batch_size=20, timeout_seconds=2.0, lease_seconds=10.0,
                       retry_base_seconds=0.05, retry_cap_seconds=0.2, allow_private=True,
                       circuit_open_seconds=0.5, circuit_max_open_seconds=2.0)
