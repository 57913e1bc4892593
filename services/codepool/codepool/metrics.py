"""In-process counters of code pool events (DESIGN.md, "Observability"). Per process; logged when
they change (bootstrap wires cutylib.metrics.log_periodically)."""
from __future__ import annotations

from cutylib.metrics import Metrics

RESERVATIONS_CAPPED = "reservations_capped"   # RESOURCE_EXHAUSTED: a per-customer cap (issue 10)

REGISTRY = Metrics()
