"""The code pool's metrics: stock per product and state (a gauge refreshed from the
database every CUTY_METRICS_REFRESH_SECONDS, never counted per request), reservations, deliveries,
expiries and reveals. `REGISTRY` is the process's instance (cutylib.metrics)."""
from __future__ import annotations

import prometheus_client

from cutylib.config import env_int
from cutylib.metrics import Metrics

# The label is bounded: one series per state for each of the `$1` products nearest to running out
# (fewest available codes first; products never stocked last), and the others as product_id="other"
# (the whole code pool's stock less the shown ones), so a sum over every series is still the whole
# stock whatever the number of products (CUTY_METRICS_STOCK_PRODUCTS, 50). Read from the stock
# round's summary (codepool_stock_round: as of its last round, every CUTY_STOCK_LOW_RECHECK_SECONDS):
# `$1` rows of the index stock_summary_nearest and the one row of stock_totals, whatever the catalogue.
STOCK_BY_PRODUCT = """
WITH shown AS (
    SELECT s.product_id::text, s.available, s.reserved, s.delivered, s.quarantined, s.revoked FROM stock_summary s
    ORDER BY (s.available + s.reserved + s.delivered) = 0, s.available, s.product_id
    LIMIT $1
)
SELECT product_id, available, reserved, delivered, quarantined, revoked FROM shown
UNION ALL
SELECT 'other', (t.available - coalesce(sum(s.available), 0))::bigint,
       (t.reserved - coalesce(sum(s.reserved), 0))::bigint, (t.delivered - coalesce(sum(s.delivered), 0))::bigint,
       (t.quarantined - coalesce(sum(s.quarantined), 0))::bigint, (t.revoked - coalesce(sum(s.revoked), 0))::bigint
FROM stock_totals t LEFT JOIN shown s ON true
GROUP BY t.available, t.reserved, t.delivered, t.quarantined, t.revoked
"""
STATES = ("available", "reserved", "delivered", "quarantined", "revoked")
OTHER = "other"


class CodePoolMetrics(Metrics):
    def __init__(self, registry=None):
        super().__init__(registry)
        # Read from the database: exported by the metrics leader only (bootstrap.py, LeaseLeader).
        self.codes = self.db_gauge("cuty_codepool_codes", "Codes per product and state (refreshed periodically)",
                                   ["product_id", "state"])
        # outcome: reserved | out_of_stock | capped (a per-customer cap)
        self.reservations = self.counter("cuty_codepool_reservations_total", "ReserveCodes results", ["outcome"])
        self.codes_reserved = self.counter("cuty_codepool_codes_reserved_total", "Codes reserved")
        self.deliveries = self.counter("cuty_codepool_deliveries_total", "DeliverCodes results", ["outcome"])
        self.codes_delivered = self.counter("cuty_codepool_codes_delivered_total", "Codes delivered")
        self.reservations_expired = self.counter(
            "cuty_codepool_reservations_expired_total", "Reservations released by the sweeper after their TTL")
        self.reveals = self.counter("cuty_codepool_reveals_total", "Codes revealed to an admin (audited)")
        # Plaintext reads by the buyer (GetDeliveredCodes), codes per read; each also audited.
        self.buyer_reads = self.counter("cuty_codepool_codes_read_by_buyer_total",
                                        "Delivered codes read in plaintext by their buyer (audited)")
        # outcome: opened | replace | reject | refund | refunded | reopen (docs/codepool.md, "Claims")
        self.claims = self.counter("cuty_codepool_claims_total", "Claims on delivered codes: opened, and each "
                                   "step of their resolution", ["outcome"])
        self._stock_labels: set[tuple[str, str]] = set()

    async def refresh_stock(self, pool, top: int | None = None) -> None:
        top = env_int("CUTY_METRICS_STOCK_PRODUCTS", 50) if top is None else top
        seen = set()
        for r in await pool.fetch(STOCK_BY_PRODUCT, top):
            for state in STATES:
                self.codes.labels(r["product_id"], state).set(r[state])
                seen.add((r["product_id"], state))
        for labels in self._stock_labels - seen:
            self.codes.remove(*labels)  # a product no longer among the shown ones (or deleted)
        self._stock_labels = seen


REGISTRY = CodePoolMetrics(prometheus_client.REGISTRY)
