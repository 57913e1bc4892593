"""The code pool's metrics (issue 15): stock per product and state (a gauge refreshed from the
database every CUTY_METRICS_REFRESH_SECONDS, never counted per request), reservations, deliveries,
expiries and reveals. `REGISTRY` is the process's instance (cutylib.metrics)."""
from __future__ import annotations

import prometheus_client

from cutylib.metrics import Metrics

# One row per product and state, from the counter rows (product_stock): a few rows per product,
# whatever the number of codes. Products with no codes report 0.
STOCK_BY_PRODUCT = """
SELECT p.id::text AS product_id, s.state,
       coalesce(CASE s.state WHEN 'available' THEN c.available WHEN 'reserved' THEN c.reserved
                             WHEN 'delivered' THEN c.delivered WHEN 'quarantined' THEN c.quarantined
                             ELSE c.revoked END, 0)::bigint AS n
FROM products p
CROSS JOIN (VALUES ('available'), ('reserved'), ('delivered'), ('quarantined'), ('revoked')) AS s(state)
LEFT JOIN (SELECT merchant_id, product_id, sum(available) AS available, sum(reserved) AS reserved,
                  sum(delivered) AS delivered, sum(quarantined) AS quarantined, sum(revoked) AS revoked
           FROM product_stock GROUP BY merchant_id, product_id) c
       ON c.merchant_id = p.merchant_id AND c.product_id = p.id
"""


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
        # Plaintext reads by the buyer (GetDeliveredCodes), codes per read; each also audited (issue 10).
        self.buyer_reads = self.counter("cuty_codepool_codes_read_by_buyer_total",
                                        "Delivered codes read in plaintext by their buyer (audited)")
        # outcome: opened | replace | reject | refund | refunded | reopen (docs/codepool.md, "Claims")
        self.claims = self.counter("cuty_codepool_claims_total", "Claims on delivered codes: opened, and each "
                                   "step of their resolution", ["outcome"])
        self._stock_labels: set[tuple[str, str]] = set()

    async def refresh_stock(self, pool) -> None:
        rows = await pool.fetch(STOCK_BY_PRODUCT)
        seen = set()
        for r in rows:
            self.codes.labels(r["product_id"], r["state"]).set(r["n"])
            seen.add((r["product_id"], r["state"]))
        for labels in self._stock_labels - seen:
            self.codes.remove(*labels)  # a product deleted since the last round
        self._stock_labels = seen


REGISTRY = CodePoolMetrics(prometheus_client.REGISTRY)
