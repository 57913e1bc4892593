"""The poller of lost dispute webhooks (docs/payments.md, "Disputes"): a webhook the PSP never
delivered (its retries exhausted, an endpoint misrouted) must not leave a dispute unknown until its
deadline passes unanswered. Every CUTY_DISPUTE_POLL_SECONDS one replica (cutylib.metrics.LeaseLeader,
lease `dispute-poll`) asks the PSP's list API for the disputes changed since its watermark, and
longer than CUTY_DISPUTE_POLL_GRACE_SECONDS (60) ago, so a webhook on its way is not overtaken
(audit_watermarks 'disputes': an instant and the last dispute id at it) and hands each to the
DisputeInbox as the event the webhook would have brought: the same function (disputes_record), so
the same dedupe, forward-only moves, timeline and merchant events; a dispute the webhook already
brought changes nothing. The watermark moves with a conditional UPDATE after each page; every loop
is bounded (MAX_PAGES pages of PAGE disputes per round).
"""
from __future__ import annotations

import itertools
import logging
from datetime import datetime, timedelta, timezone

from cutylib.config import env_float
from cutylib.metrics import LeaseLeader
from cutylib.periodic import TRANSIENT, periodic
from cutylib.psp import PspError, PspUnavailable
from cutylib.telemetry import quiet

log = logging.getLogger("payments.disputes.poller")

WATERMARK = "disputes"
PAGE = 100
MAX_PAGES = 50
# The event each dispute status stands for (the PSP's types; disputes_record reads the object).
EVENT_TYPE = {"needs_response": "charge.dispute.created", "under_review": "charge.dispute.updated",
              "won": "charge.dispute.closed", "lost": "charge.dispute.closed"}

READ = "SELECT watermark, after_id FROM audit_watermarks WHERE name = $1"
INIT = "INSERT INTO audit_watermarks (name, watermark) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"
ADVANCE = """
UPDATE audit_watermarks SET watermark = $4, after_id = $5, updated_at = clock_timestamp()
WHERE name = $1 AND watermark = $2 AND after_id = $3"""


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _micros(unix_seconds: float) -> int:
    """The PSP's instant to the microsecond, as the watermark (timestamptz) keeps it."""
    return round(unix_seconds * 1_000_000)


def _micros_of(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


def interval_seconds() -> float:
    return env_float("CUTY_DISPUTE_POLL_SECONDS", 300.0)


class DisputePoller:
    def __init__(self, pool, psp, inbox, *, interval: float | None = None, start_back_seconds: float | None = None,
                 worker_id: str = ""):
        self.pool, self.psp, self.inbox = pool, psp, inbox
        self.interval = interval_seconds() if interval is None else interval
        self.start_back = (env_float("CUTY_DISPUTE_POLL_START_BACK_SECONDS", 7 * 86400.0)
                           if start_back_seconds is None else start_back_seconds)
        # A change this recent may still have its webhook on the way: left to the next round.
        self.grace = env_float("CUTY_DISPUTE_POLL_GRACE_SECONDS", 60.0)
        self.leader = LeaseLeader(pool, "dispute-poll", ttl=max(3 * self.interval, 60.0), holder=worker_id or None)

    async def run(self) -> None:
        if self.interval <= 0:
            return
        try:
            await periodic(self.round, self.interval, what="dispute poll", log=log,
                           retry_on=TRANSIENT + (PspUnavailable, PspError))
        finally:
            await self.leader.resign()

    async def round(self) -> int:
        """Disputes applied this round (those the webhooks had not brought count too: no change)."""
        with quiet():  # a poll: no trace per round (the election's statements included)
            return await self._round()

    async def _round(self) -> int:
        if not await self.leader.elect():
            return 0
        now = await self.pool.fetchval("SELECT clock_timestamp()")
        await self.pool.execute(INIT, WATERMARK, now - timedelta(seconds=self.start_back))
        cutoff = _micros_of(now) - round(self.grace * 1_000_000)
        seen = 0
        with quiet():
            for _ in range(MAX_PAGES):
                mark, after = await self.pool.fetchrow(READ, WATERMARK)
                page = await self.psp.list_disputes(mark.timestamp(), limit=PAGE)
                # At the watermark's own instant, only those after the last one handled.
                fresh = [d for d in page["data"] if (_micros(d["updated"]), d["id"]) > (_micros_of(mark), after)]
                # Oldest first: up to the first change still within the grace period (its webhook may
                # be on the way), which the next round takes.
                settled = list(itertools.takewhile(lambda d: _micros(d["updated"]) < cutoff, fresh))
                within_grace = len(settled) < len(fresh)
                fresh = settled
                for d in fresh:
                    if d.get("status") not in EVENT_TYPE:
                        continue
                    outcome = await self.inbox.record({"id": f"poll:{d['id']}:{d['status']}",
                                                       "type": EVENT_TYPE[d["status"]], "data": {"object": d}})
                    if outcome == "processed":
                        seen += 1
                if not fresh:
                    break
                last = fresh[-1]
                moved = await self.pool.execute(ADVANCE, WATERMARK, mark, after,
                                                EPOCH + timedelta(microseconds=_micros(last["updated"])), last["id"])
                if moved != "UPDATE 1" or within_grace or not page.get("has_more"):
                    break
        if seen:
            log.info("disputes polled", extra={"disputes": seen})
        return seen
