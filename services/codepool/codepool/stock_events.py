"""The code pool's outbox of merchant events (`stock.low`; docs/codepool.md "Low stock").

The events are written by the database, in the statement that changes a product's available stock
(migrations/functions/codepool_check_stock.sql), or, when two reservations raced past the threshold
on the lock-free fast path (codepool_stock_changed), by the stock round this module runs every
CUTY_STOCK_LOW_RECHECK_SECONDS (codepool_stock_round: the products whose counters changed since the
last round, summed for the stock gauge and their flags re-decided). Otherwise it only reads them out, oldest
first after a cursor, for the orchestrator's relay. `seq` order is commit order (stock_events in
migrations/0001_baseline.sql says why), so a keyset read never skips an event that commits late.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from cutylib.config import env_float, env_int
from cutylib.periodic import periodic
from cutylib.telemetry import quiet

log = logging.getLogger("codepool.stock_events")

# How often the stock round runs: the products changed since the last one are summed (the stock
# gauge's summary) and their low-stock flags re-decided where a race left them wrong.
RECHECK_SECONDS_DEFAULT = 5.0
# Products per round transaction (CUTY_STOCK_ROUND_PRODUCTS), and rounds per run at most: a run
# summing more (the first after the upgrade: every product once) leaves the rest to the next.
ROUND_PRODUCTS_DEFAULT = 50
ROUNDS_PER_RUN = 100

LIST_AFTER = """
SELECT seq, merchant_id, id, type, payload, created_at, order_id FROM stock_events
WHERE seq > $1 ORDER BY seq LIMIT $2
"""


@dataclass(frozen=True)
class StockEvent:
    seq: int
    id: str
    merchant_id: str
    type: str
    payload_json: str
    created_at: datetime
    order_id: str = ""  # the order a claim's event is about (docs/codepool.md, "Claims")

    @classmethod
    def from_row(cls, r) -> "StockEvent":
        payload = r["payload"] if isinstance(r["payload"], str) else json.dumps(r["payload"], separators=(",", ":"))
        return cls(r["seq"], str(r["id"]), r["merchant_id"], r["type"], payload, r["created_at"], r["order_id"] or "")


class StockEvents:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def after(self, after_seq: int, limit: int) -> list[StockEvent]:
        """One statement, every merchant's events (the caller is the system's relay)."""
        return [StockEvent.from_row(r) for r in await self.pool.fetch(LIST_AFTER, after_seq, limit)]

    async def recheck(self, products: int | None = None) -> int:
        """Stock rounds until nothing changed is left (at most ROUNDS_PER_RUN): the products whose
        counters changed summed, and their flags re-decided where they disagree with the stock (a
        race on the fast path); how many flags. Each round one statement and transaction of at most
        `products` products: its locks are held until it commits. Another replica's round running
        makes this one return at once (it has the same work)."""
        products = products or env_int("CUTY_STOCK_ROUND_PRODUCTS", ROUND_PRODUCTS_DEFAULT)
        redecided = 0
        with quiet():  # an idle round starts no trace
            for _ in range(ROUNDS_PER_RUN):
                r = await self.pool.fetchrow("SELECT * FROM codepool_stock_round($1)", products)
                redecided += r["redecided"]
                if r["summarised"] < products:
                    break
        if redecided:
            log.info("low-stock flags re-decided", extra={"products": redecided})
        return redecided

    async def run_recheck(self, interval: float | None = None) -> None:
        """Background task: recheck every CUTY_STOCK_LOW_RECHECK_SECONDS."""
        every = interval if interval is not None else env_float("CUTY_STOCK_LOW_RECHECK_SECONDS", RECHECK_SECONDS_DEFAULT)
        await periodic(self.recheck, every, what="stock.low recheck", log=log)
