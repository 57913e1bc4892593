"""In-process counters of code pool events (DESIGN.md, "Observability"). Per process; logged when
they change (bootstrap wires cutylib.metrics.log_periodically)."""
from __future__ import annotations

from cutylib.metrics import Metrics

RESERVATIONS_CAPPED = "reservations_capped"   # RESOURCE_EXHAUSTED: a per-customer cap (issue 10)
# Plaintext reads of codes (issue 10, item 12), each also audited and counted per code in code_views.
CODES_REVEALED = "codes_revealed"             # RevealCode by an admin
CODES_READ_BY_BUYER = "codes_read_by_buyer"   # GetDeliveredCodes, codes per read

REGISTRY = Metrics()
