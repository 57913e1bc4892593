"""The code pool's metrics: stock per product and state (a gauge refreshed from the
database every CUTY_METRICS_REFRESH_SECONDS, never counted per request), reservations, deliveries,
expiries and reveals. `REGISTRY` is the process's instance (cutylib.metrics)."""
from __future__ import annotations

import prometheus_client

from cutylib.config import env_int
from cutylib.metrics import Metrics

# The label is bounded: one series per state for each of the `$1` products nearest to running out
# (fewest available codes first; products never stocked last), and the others summed as
# product_id="other", so a sum over every series is still the whole stock whatever the number of
# products (CUTY_METRICS_STOCK_PRODUCTS, 50). Read from the counter rows (product_stock).
STOCK_BY_PRODUCT = """
WITH stock AS (
    SELECT p.id, coalesce(c.available, 0) AS available, coalesce(c.reserved, 0) AS reserved,
           coalesce(c.delivered, 0) AS delivered, coalesce(c.quarantined, 0) AS quarantined,
           coalesce(c.revoked, 0) AS revoked
    FROM products p
    LEFT JOIN (SELECT merchant_id, product_id, sum(available) AS available, sum(reserved) AS reserved,
                      sum(delivered) AS delivered, sum(quarantined) AS quarantined, sum(revoked) AS revoked
               FROM product_stock GROUP BY merchant_id, product_id) c
           ON c.merchant_id = p.merchant_id AND c.product_id = p.id
), ranked AS (
    SELECT *, row_number() OVER (ORDER BY available + reserved + delivered = 0, available, id) AS rank FROM stock
)
SELECT CASE WHEN rank <= $1 THEN id::text ELSE 'other' END AS product_id,
       sum(available)::bigint AS available, sum(reserved)::bigint AS reserved, sum(delivered)::bigint AS delivered,
       sum(quarantined)::bigint AS quarantined, sum(revoked)::bigint AS revoked
FROM ranked GROUP BY 1
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
