"""The orchestrator: payments against the PSP (one finalize path) and the checkout saga."""
