"""In-process counters of booking events (DESIGN.md, "Observability": hold conflicts, expirations
swept). Per process; the sweeper logs them when they change."""
from __future__ import annotations

from cutylib.metrics import Metrics

HOLDS_CREATED = "holds_created"
HOLD_CONFLICTS = "hold_conflicts"          # HoldSlot lost the race (ALREADY_EXISTS)
HOLDS_CAPPED = "holds_capped"              # RESOURCE_EXHAUSTED: too many active holds
HOLDS_REACQUIRED = "holds_reacquired"      # ConfirmHold of an expired hold whose time was free
HOLDS_LOST = "holds_lost"                  # ConfirmHold of an expired hold whose time was taken
CONFIRMS_TOO_LATE = "confirms_too_late"    # ConfirmHold after (or within the cutoff of) the slot's start
HOLDS_SWEPT = "holds_swept"
SWEEPS = "sweeps"


REGISTRY = Metrics()
