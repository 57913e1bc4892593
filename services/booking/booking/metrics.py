"""Booking's metrics (docs/observability.md: hold conflicts, expirations swept).
`REGISTRY` is the process's instance, exported on CUTY_BOOKING_METRICS_PORT (cutylib.metrics)."""
from __future__ import annotations

import prometheus_client

from cutylib.metrics import Metrics


class BookingMetrics(Metrics):
    def __init__(self, registry=None):
        super().__init__(registry)
        self.holds_taken = self.counter("cuty_booking_holds_taken_total", "Holds taken (HoldSlot won the slot)")
        self.hold_conflicts = self.counter(
            "cuty_booking_hold_conflicts_total", "HoldSlot lost the race (ALREADY_EXISTS), by whether "
            "alternatives were offered", ["alternatives"])
        self.alternatives_offered = self.counter(
            "cuty_booking_alternatives_offered_total", "Alternative slots offered to the losers of a race")
        self.losers_from_memory = self.counter(
            "cuty_booking_losers_from_memory_total",
            "HoldSlot losers answered from what this replica knows of a blocked slot (no database round trip)")
        self.holds_capped = self.counter(
            "cuty_booking_holds_capped_total", "HoldSlot refused: the customer has too many active holds")
        self.holds_taken_over = self.counter(
            "cuty_booking_expired_holds_taken_over_total",
            "Expired holds that a new HoldSlot retired before the sweeper did (expired holds never block)")
        self.offers_made = self.counter(
            "cuty_booking_offers_made_total", "Race losers for whom an alternative was held at once (a short hold)")
        self.offers_accepted = self.counter(
            "cuty_booking_offers_accepted_total", "Alternatives held for a race loser that the loser then took")
        self.holds_swept = self.counter("cuty_booking_holds_swept_total", "Expired holds marked expired by the sweeper")
        self.sweeps = self.counter("cuty_booking_sweeps_total", "Sweeper rounds")
        # outcome: confirmed | reacquired (expired, time still free) | hold_lost (expired and taken)
        # | too_late (the slot has started, or starts within CUTY_CONFIRM_CUTOFF_SECONDS)
        self.confirmations = self.counter("cuty_booking_confirmations_total", "ConfirmHold results", ["outcome"])


REGISTRY = BookingMetrics(prometheus_client.REGISTRY)
