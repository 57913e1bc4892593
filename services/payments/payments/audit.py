"""The invariant auditor (docs/payments.md, "The invariant auditor"): a periodic job that proves, one
time window after another, that payments, booking, the code pool and the PSP agree. The three
databases share no transaction, so this is the standing check that they ended up telling one story.

It reads payments' own database, and the others' facts only through their system-only digests
(booking `SummarizeHolds`/`DigestHolds`, the code pool `SummarizeDeliveries`/`DigestDeliveries`)
and the PSP's balance report and list API (charges and refunds of a window): no service reads
another's database. A window [a, b) is the checkouts created in it.

Booking, the code pool and the PSP first answer a summary of the window per bucket of the join
key's hash (hold id, order id, payment intent id; cutylib.digests): a count and a sum of 64-bit
fingerprints of the facts the checks below look at (the PSP's is its balance report of the charges
captured in the window). Payments sums in SQL, one statement, what each of its checkouts expects of
each side the same way (SUMMARY), and only the buckets that disagree are read row by row: the other
side's rows for [a, b + slack) (what a checkout of the window made a little later) and the
checkouts with a key in them, checked as below. A bucket that agrees holds exactly the facts the
checks would pass, so a window where the books balance moves a few hundred numbers per side, not
its rows. The PSP's refunds are listed and checked whole (a window has few). An id found on one side
only gets a second look by id before it is reported (a reschedule's hold made days later, a charge
captured late, a fact whose checkout was created in an earlier window).

The invariants, and the finding each violation records (table audit_findings, unique per kind and
offending id):
- every captured charge is a payment of ours (`psp_charge_unknown`) whose checkout ended sold
  (COMPLETED or after) or refunded (`payment_unresolved`), and a sold checkout's payment was
  captured (`charge_missing`);
- what the PSP kept of a charge equals what the payment says was kept: captured minus refunds
  settled (`amount_mismatch`); every refund the PSP made is one of ours (`psp_refund_unknown`);
- every completed booking checkout has its hold confirmed with its payment (`hold_not_confirmed`),
  and every confirmed hold belongs to a sold checkout (`hold_without_checkout`);
- every completed code checkout has exactly its quantity of codes delivered, replacements counted
  (delivered + revoked - replaced = quantity: `codes_count_mismatch`), and every delivered order
  is a sold checkout (`codes_without_checkout`);
- no code is delivered twice (`code_delivered_twice`).

One replica runs it at a time (cutylib.metrics.LeaseLeader, lease `audit`); it audits the windows
after its watermark (audit_watermarks 'invariants') that ended at least CUTY_AUDIT_SETTLE_SECONDS
ago (by then a checkout is terminal), at most CUTY_AUDIT_MAX_WINDOWS per round, and advances the
watermark with a conditional UPDATE. Catching up a backlog, it works at most CUTY_AUDIT_DUTY_CYCLE
of the wall time (DutyCycle), so the buyers keep the machine. Every loop is bounded: pages of a window (MAX_PAGES), second
looks per window (MAX_SECOND_LOOKS; more fail the window, which is tried again next round and shows
as lag), windows per round.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

import grpc

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cutylib import digests
from cutylib.config import env_float, env_int
from cutylib.db import reports
from cutylib.metrics import LeaseLeader
from cutylib.periodic import TRANSIENT, periodic
from cutylib.psp import PspError, PspUnavailable
from cutylib.telemetry import quiet
from cutylib.timestamps import from_timestamp, to_timestamp

log = logging.getLogger(__name__)

KINDS = ("psp_charge_unknown", "payment_unresolved", "charge_missing", "amount_mismatch", "psp_refund_unknown",
         "hold_not_confirmed", "hold_without_checkout", "codes_count_mismatch", "codes_without_checkout",
         "code_delivered_twice")
WATERMARK = "invariants"
LEASE = "audit"
PAGE = 5000  # digest and checkout pages (the digests' maximum)
PSP_PAGE = 1000  # the PSP list API's maximum
PSP_DRILL_BUCKETS = 1024  # the most buckets a PSP charges list is filtered by (its query string's bound)
MAX_PAGES = 400  # per source and window: 2,000,000 checkouts, far beyond a window of a busy day
MAX_SECOND_LOOKS = 2000  # per window; more fail the window (tried again next round)
SECOND_LOOK_CONCURRENCY = 16
# Buckets of a window's summaries: about BUCKET_FACTS facts per bucket of the last window, a power
# of two within [MIN_BUCKETS, digests.MAX_DRILL_BUCKETS] (a drill-down names at most that many).
BUCKET_FACTS = 8
MIN_BUCKETS = 64
# Windows audited together: one's checks overlap another's reads (the digests and the PSP answer
# from other processes).
WINDOWS_AT_ONCE = 2
# Where a checkout stands once the purchase went through (the goods are the buyer's, or were until
# a cancel after purchase refunded them).
SOLD = frozenset({"COMPLETED", "CANCELLED_AFTER_PURCHASE", "RESCHEDULING", "RESCHEDULE_CONFIRMING",
                  "RESCHEDULE_REVERTING"})
CAPTURED = frozenset({"succeeded", "partially_refunded", "refunded"})


@dataclass(frozen=True)
class AuditSettings:
    window_seconds: float = 600.0      # CUTY_AUDIT_WINDOW_SECONDS
    slack_seconds: float = 120.0       # CUTY_AUDIT_SLACK_SECONDS: facts made this long after their window
    settle_seconds: float = 900.0      # CUTY_AUDIT_SETTLE_SECONDS: a window is audited this long after it ended
    interval_seconds: float = 60.0     # CUTY_AUDIT_INTERVAL_SECONDS (0: the job does not run)
    max_windows: int = 12              # CUTY_AUDIT_MAX_WINDOWS: per round
    start_back_seconds: float = 86400.0  # CUTY_AUDIT_START_BACK_SECONDS: the first watermark, before now
    # CUTY_AUDIT_DUTY_CYCLE: the share of wall time the job may spend auditing when it has windows
    # to catch up (after a batch that took t seconds it rests t * (1 - d) / d; 1: no rest).
    duty_cycle: float = 0.1
    # CUTY_AUDIT_SUMMARIES: compare per-bucket summaries first (1), or read every row of booking's
    # and the code pool's digests as before them (0: what the benchmark compares against)
    summaries: bool = True

    @classmethod
    def from_env(cls) -> "AuditSettings":
        d = cls()
        s = cls(window_seconds=env_float("CUTY_AUDIT_WINDOW_SECONDS", d.window_seconds),
                slack_seconds=env_float("CUTY_AUDIT_SLACK_SECONDS", d.slack_seconds),
                settle_seconds=env_float("CUTY_AUDIT_SETTLE_SECONDS", d.settle_seconds),
                interval_seconds=env_float("CUTY_AUDIT_INTERVAL_SECONDS", d.interval_seconds),
                max_windows=env_int("CUTY_AUDIT_MAX_WINDOWS", d.max_windows),
                start_back_seconds=env_float("CUTY_AUDIT_START_BACK_SECONDS", d.start_back_seconds),
                duty_cycle=env_float("CUTY_AUDIT_DUTY_CYCLE", d.duty_cycle),
                summaries=env_int("CUTY_AUDIT_SUMMARIES", 1) != 0)
        if not 0 < s.window_seconds <= 86400 - s.slack_seconds or s.slack_seconds < 0 or s.settle_seconds < 0 \
                or s.interval_seconds < 0 or s.max_windows < 1 or s.start_back_seconds < 0 \
                or not 0 < s.duty_cycle <= 1:
            raise ValueError("CUTY_AUDIT_*: window 0 < w and w + slack <= 1 day, slack, settle, interval and "
                             "start back >= 0, max windows >= 1, 0 < duty cycle <= 1")
        return s


@dataclass(frozen=True)
class Finding:
    kind: str
    subject: str  # the offending id
    detail: str = ""
    checkout_id: str | None = None
    payment_id: str | None = None
    psp_id: str | None = None
    other_id: str | None = None
    merchant_id: str | None = None


class DutyCycle:
    """The auditor's bound on its own share of the machine while it catches up a backlog: after work
    that took t seconds it is free again t * (1 - duty) / duty seconds later, so it works at most
    `duty` of the wall time (the digests, the PSP's lists and the databases it reads from included,
    as their work is proportional to its). Kept across rounds: a round that begins right after a
    long one still rests first. Keeping pace with the sales (one window a window's time) it never
    waits."""

    def __init__(self, duty: float, clock=time.monotonic) -> None:
        self.duty, self.clock = duty, clock
        self.free_at = 0.0

    def worked(self, seconds: float) -> None:
        self.free_at = max(self.free_at, self.clock() + seconds * (1.0 - self.duty) / self.duty)

    def wait(self) -> float:
        """Seconds to rest before the next batch of windows."""
        return max(0.0, self.free_at - self.clock())


class WindowNotAudited(Exception):
    """A window that could not be checked whole this round (too many second looks, a source away)."""


@dataclass
class Checked:
    """What one window's audit saw and found."""
    start: datetime
    end: datetime
    checkouts: int = 0
    holds: int = 0
    orders: int = 0
    charges: int = 0
    refunds: int = 0
    findings: list[Finding] = field(default_factory=list)
    new: int = 0  # findings not recorded before
    timings: dict[str, float] = field(default_factory=dict)  # seconds per source read, and the checks
    buckets: int = 0  # the summaries' bucket count
    drilled: dict[str, int] = field(default_factory=dict)  # buckets read row by row, per side
    rows: int = 0  # payments' own checkouts read row by row (those of the buckets read)


# What each checkout of a window expects of the other sides, as their summaries fingerprint it
# (cutylib.digests), per bucket of the join key: booking's SummarizeHolds hashes (hold id,
# payment_ref, merchant) of a confirmed hold not cancelled; the code pool's SummarizeDeliveries (order
# id, merchant, codes counted, codes shared with another order) of a delivered order; the PSP's
# balance report (intent, amount captured, amount refunded) of a captured charge. A completed
# booking expects its hold confirmed with its payment, a completed code checkout its order with its
# quantity and no shared code, a captured payment whose checkout was sold or that was refunded its
# charge keeping what the payment says. A captured payment that is neither (the check would report
# `payment_unresolved`) expects a fact no PSP reports, so that its bucket disagrees and is read.
_ORDER_KEY = "coalesce(c.order_id::text, c.id::text)"
_CAPTURED_SQL = "('succeeded', 'partially_refunded', 'refunded')"
_SOLD_SQL = ("('COMPLETED', 'CANCELLED_AFTER_PURCHASE', 'RESCHEDULING', 'RESCHEDULE_CONFIRMING', "
             "'RESCHEDULE_REVERTING')")
_HOLD_BUCKET = f"CASE WHEN c.hold_id IS NOT NULL THEN {digests.bucket_sql('c.hold_id', '$3::int')} END"
_ORDER_BUCKET = f"CASE WHEN c.kind = 'codes' THEN {digests.bucket_sql(_ORDER_KEY, '$3::int')} END"
_CHARGE_BUCKET = f"CASE WHEN p.psp_intent_id IS NOT NULL THEN {digests.bucket_sql('p.psp_intent_id', '$3::int')} END"
_HOLD_FP = f"""CASE WHEN c.kind = 'booking' AND c.state = 'COMPLETED' AND c.hold_id IS NOT NULL
             THEN {digests.fingerprint_sql("c.hold_id", "coalesce(c.payment_id::text, c.payment_key::text)",
                                           "c.merchant_id")} END"""
_ORDER_FP = f"""CASE WHEN c.kind = 'codes' AND c.state = 'COMPLETED'
             THEN {digests.fingerprint_sql(_ORDER_KEY, "c.merchant_id", "c.quantity", "0")} END"""
_CHARGE_FP = f"""CASE WHEN p.psp_intent_id IS NULL OR p.status NOT IN {_CAPTURED_SQL} THEN NULL
             WHEN p.refund_settled_minor > 0 OR c.state IN {_SOLD_SQL}
             THEN {digests.fingerprint_sql("p.psp_intent_id", "p.amount_minor", "p.refund_settled_minor")}
             ELSE {digests.fingerprint_sql("p.psp_intent_id", "'unresolved'")} END"""
# The window's summary, one statement: per side and bucket ($3 buckets), the count and the sum of
# the fingerprints, from one scan of the window's checkouts and grouping sets (a fact per checkout
# and side computed once; faster than a row per side, or a scan per side); side 'checkouts'
# (bucket 0) counts the window's checkouts. Nothing per row leaves the database. A bucket with no
# fact of its side (only checkouts that expect nothing there) answers n = 0: no bucket.
_GROUPED = "GROUPING(x.hb, x.ob, x.cb)"  # 3: by hold bucket, 5: by order bucket, 6: by charge bucket, 7: all
SUMMARY = f"""
SELECT CASE {_GROUPED} WHEN 3 THEN 'holds' WHEN 5 THEN 'orders' WHEN 6 THEN 'charges' ELSE 'checkouts' END AS side,
       coalesce(x.hb, x.ob, x.cb, 0) AS bucket,
       CASE {_GROUPED} WHEN 3 THEN count(x.hf) WHEN 5 THEN count(x.xf) WHEN 6 THEN count(x.cf) ELSE count(*) END AS n,
       CASE {_GROUPED} WHEN 3 THEN sum(x.hf) WHEN 5 THEN sum(x.xf) WHEN 6 THEN sum(x.cf) END AS fingerprint
FROM (SELECT {_HOLD_BUCKET} AS hb, {_HOLD_FP} AS hf, {_ORDER_BUCKET} AS ob, {_ORDER_FP} AS xf,
             {_CHARGE_BUCKET} AS cb, {_CHARGE_FP} AS cf
      FROM checkouts c LEFT JOIN payments p ON p.id = c.payment_id
      WHERE c.created_at >= $1 AND c.created_at < $2) x
GROUP BY GROUPING SETS ((x.hb), (x.ob), (x.cb), ())"""
# The window's checkouts with their payments, in pages by (created_at, id): those with a key in one of
# the buckets that disagreed ($7 holds, $8 orders, $9 charges, of $6), or every one ($7 NULL).
CHECKOUTS = f"""
SELECT * FROM (
    SELECT c.id, c.kind, c.state, c.quantity, c.hold_id, c.order_id, c.payment_id, c.payment_key, c.merchant_id,
           c.created_at, p.status AS pay_status, p.psp_intent_id, p.amount_minor AS pay_amount,
           p.refund_settled_minor, p.currency,
           {_HOLD_BUCKET.replace('$3', '$6')} AS hold_bucket, {_ORDER_BUCKET.replace('$3', '$6')} AS order_bucket,
           {_CHARGE_BUCKET.replace('$3', '$6')} AS charge_bucket
    FROM checkouts c LEFT JOIN payments p ON p.id = c.payment_id
    WHERE c.created_at >= $1 AND c.created_at < $2
      AND ($3::timestamptz IS NULL OR (c.created_at, c.id) > ($3, $4::uuid))) x
WHERE $7::int[] IS NULL OR x.hold_bucket = ANY($7::int[]) OR x.order_bucket = ANY($8::int[])
   OR x.charge_bucket = ANY($9::int[])
ORDER BY x.created_at, x.id
LIMIT $5"""
# Second looks in payments' own database (by primary or unique keys).
PAYMENTS_BY_INTENT = """
SELECT p.id, p.status, p.psp_intent_id, p.amount_minor, p.refund_settled_minor, p.merchant_id, p.checkout_id,
       c.state AS checkout_state
FROM payments p LEFT JOIN checkouts c ON c.id = p.checkout_id
WHERE p.psp_intent_id = ANY($1::text[])"""
CHECKOUTS_BY_ID = "SELECT id, state, hold_id, kind FROM checkouts WHERE id = ANY($1::uuid[])"
CHECKOUTS_BY_REF = """
SELECT c.id, c.state, c.hold_id, p.id::text AS ref FROM payments p JOIN checkouts c ON c.id = p.checkout_id
WHERE p.id = ANY($1::uuid[])
UNION ALL
SELECT c.id, c.state, c.hold_id, c.payment_key::text FROM checkouts c
WHERE (c.merchant_id, c.payment_key) IN (SELECT * FROM unnest($2::text[], $1::uuid[]))"""
OUR_REFUNDS = """
SELECT psp_refund_id FROM refunds WHERE psp_refund_id = ANY($1::text[])
UNION SELECT psp_refund_id FROM payments WHERE psp_refund_id = ANY($1::text[])"""
RECORD = """
INSERT INTO audit_findings (kind, subject, checkout_id, payment_id, psp_id, other_id, of_merchant, detail,
                            window_start, window_end)
SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::uuid[], $5::text[], $6::text[], $7::text[], $8::text[],
                     $9::timestamptz[], $10::timestamptz[])
ON CONFLICT (kind, subject) DO NOTHING
RETURNING kind"""
WATERMARK_READ = "SELECT watermark FROM audit_watermarks WHERE name = $1"
WATERMARK_INIT = """
INSERT INTO audit_watermarks (name, watermark) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"""
# Only from the value this round read: a replica that lost its lease cannot move it back or skip.
WATERMARK_ADVANCE = """
UPDATE audit_watermarks SET watermark = $3, updated_at = clock_timestamp() WHERE name = $1 AND watermark = $2"""


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


def _epoch(t: datetime) -> float:
    return t.timestamp()


def payment_ref(row) -> str:
    """What a checkout confirmed its hold / delivery with (checkout/domain.py `payment_ref`)."""
    return str(row["payment_id"] or row["payment_key"] or "")


class Auditor:
    """`booking`, `codepool`: the gRPC stubs (called as payments, `system`); `psp`: the PSP client."""

    def __init__(self, pool, booking, codepool, psp, metrics=None, *, settings: AuditSettings | None = None,
                 worker_id: str = "", deadline_seconds: float = 30.0):
        self.pool, self.booking, self.codepool, self.psp = pool, booking, codepool, psp
        self.metrics = metrics
        self.settings = settings or AuditSettings.from_env()
        self.deadline = deadline_seconds
        self.leader = LeaseLeader(pool, LEASE, ttl=max(3 * self.settings.interval_seconds, 120.0),
                                  holder=worker_id or None)
        self.duty = DutyCycle(self.settings.duty_cycle)
        self.buckets = 1024  # the next window's bucket count (from the last window's size)

    # -- the periodic job -----------------------------------------------------------------------
    async def run(self) -> None:
        if self.settings.interval_seconds <= 0:
            return
        try:
            await periodic(self.round, self.settings.interval_seconds, what="invariant audit", log=log,
                           retry_on=TRANSIENT + (grpc.aio.AioRpcError, PspUnavailable, PspError, WindowNotAudited))
        finally:
            await self.leader.resign()

    async def round(self) -> list[Checked]:
        """The windows due after the watermark (at most max_windows), if this replica leads; audited
        WINDOWS_AT_ONCE at a time, the watermark advanced past each in order."""
        with quiet():  # a standing job: no trace per round (the election's statements included)
            return await self._round()

    async def _round(self) -> list[Checked]:
        if not await self.leader.elect():
            return []
        s = self.settings
        now = await self.pool.fetchval("SELECT clock_timestamp()")
        await self.pool.execute(WATERMARK_INIT, WATERMARK, now - timedelta(seconds=s.start_back_seconds))
        done: list[Checked] = []
        step = timedelta(seconds=s.window_seconds)
        due_by = now - timedelta(seconds=s.settle_seconds)
        began = time.monotonic()
        with quiet():  # a standing job: no trace per round
            mark = await self.pool.fetchval(WATERMARK_READ, WATERMARK)
            while len(done) < s.max_windows:
                starts = [mark + i * step for i in range(min(WINDOWS_AT_ONCE, s.max_windows - len(done)))
                          if mark + (i + 1) * step <= due_by]
                if not starts:
                    break
                rest = self.duty.wait()
                if rest and time.monotonic() - began + rest > self.leader.ttl / 2:
                    break  # the lease is renewed at each round's election: the next round goes on
                for checked in await self._batch(starts, step, rest=rest):
                    if await self.pool.execute(WATERMARK_ADVANCE, WATERMARK, mark, checked.end) != "UPDATE 1":
                        return done  # another replica advanced it meanwhile (this one's lease had lapsed)
                    done.append(checked)
                    mark = checked.end
        return done

    async def _batch(self, starts: list[datetime], step: timedelta, *, until: datetime | None = None,
                     record: bool = True, rest: float | None = None) -> list[Checked]:
        """Windows audited together, after the duty cycle's rest; their time counted against it."""
        rest = self.duty.wait() if rest is None else rest
        if rest:
            await asyncio.sleep(rest)
        t = time.monotonic()
        try:
            return await _gather_all([self.audit_window(a, min(a + step, until or a + step), record=record)
                                      for a in starts])
        finally:
            self.duty.worked(time.monotonic() - t)

    async def audit_range(self, since: datetime, until: datetime, *, paced: bool = False) -> list[Checked]:
        """Every window of [since, until), WINDOWS_AT_ONCE at a time, nothing recorded, the
        watermark untouched (`ops audit --since`: the periodic job records, counts and alerts; an
        operator's check only shows). Flat out unless `paced` (then under the duty cycle, as the job)."""
        step = timedelta(seconds=self.settings.window_seconds)
        starts = [since + i * step for i in range(int((until - since) / step) + 1) if since + i * step < until]
        out: list[Checked] = []
        for i in range(0, len(starts), WINDOWS_AT_ONCE):
            out += await self._batch(starts[i:i + WINDOWS_AT_ONCE], step, until=until, record=False,
                                     rest=None if paced else 0.0)
        return out

    # -- one window -----------------------------------------------------------------------------
    async def audit_window(self, a: datetime, b: datetime, *, record: bool = True) -> Checked:
        t0 = time.perf_counter()
        wide = b + timedelta(seconds=self.settings.slack_seconds)
        timings: dict[str, float] = {}

        async def timed(what: str, read, *args):
            # the read is started here, not before: a part cancelled before it ran leaves no
            # coroutine never awaited
            t = time.perf_counter()
            try:
                return await read(*args)
            finally:
                timings[what] = round(time.perf_counter() - t, 3)
        n = self.buckets
        mine, hold_sum, order_sum, charge_sum, refunds = await _gather_all([
            timed("summary", self._own_summary, a, b, n), timed("hold_summary", self._hold_summary, a, b, n),
            timed("order_summary", self._order_summary, a, b, n),
            timed("charge_report", self._charge_report, a, b, n), timed("refunds", self._refunds_of, a, b)])
        # Each side's buckets that disagree with what the window's checkouts expect (None: every
        # bucket, no summary to compare with): only there are rows read, the other side's and the
        # checkouts with a key in them, and checked; elsewhere the facts are the same on both sides.
        own = mine or {}
        bad_holds = None if hold_sum is None or mine is None else digests.differ(own.get("holds", {}), hold_sum)
        bad_orders = None if order_sum is None or mine is None else digests.differ(own.get("orders", {}), order_sum)
        bad_charges = None if charge_sum is None or mine is None else digests.differ(own.get("charges", {}),
                                                                                      charge_sum)
        checkouts, holds, (orders, duplicates), charges = await _gather_all([
            timed("checkouts", self._checkouts, a, b, n, bad_holds, bad_orders, bad_charges),
            timed("holds", self._holds, a, wide, n, bad_holds),
            timed("orders", self._orders, a, wide, n, bad_orders),
            timed("charges", self._charges, a, wide, n, bad_charges)])
        t_read = time.perf_counter()

        def counted(summary, rows) -> int:
            return len(rows) if summary is None else sum(x.count for x in summary.values())
        checked = Checked(a, b, counted(None if mine is None else own.get("checkouts", {}), checkouts),
                          counted(hold_sum, holds), counted(order_sum, orders), counted(charge_sum, charges),
                          len(refunds), timings=timings, buckets=n,
                          drilled={side: n if bad is None else len(bad) for side, bad in
                                   (("holds", bad_holds), ("orders", bad_orders), ("charges", bad_charges))},
                          rows=len(checkouts))
        self.buckets = _bucket_count(max(checked.holds, checked.orders, checked.charges))
        f = checked.findings
        looks = _Looks()
        money = _in(checkouts, "charge_bucket", bad_charges)
        by_intent = {c["psp_intent_id"]: c for c in money if c["psp_intent_id"]}
        f += await self._money(money, charges, by_intent, a, b, looks)
        f += await self._refunds(refunds)
        f += await self._bookings(_in(checkouts, "hold_bucket", bad_holds), holds, a, b, looks)
        f += await self._codes(_in(checkouts, "order_bucket", bad_orders), orders, duplicates, a, b)
        timings["checks"] = round(time.perf_counter() - t_read, 3)
        if not record:
            return checked
        checked.new = await self._record(f, a, b)
        if self.metrics is not None:
            self.metrics.audit_checkouts.inc(checked.checkouts)
            self.metrics.audit_window_seconds.observe(time.perf_counter() - t0)
        log.log(logging.WARNING if f else logging.INFO, "window audited", extra={
            "start": a.isoformat(), "end": b.isoformat(), "checkouts": checked.checkouts, "findings": len(f),
            "new_findings": checked.new, "seconds": timings,
            "buckets": checked.buckets, "buckets_read": checked.drilled})
        return checked

    async def _own_summary(self, a: datetime, b: datetime, buckets: int) -> dict[str, dict[int, digests.Bucket]] | None:
        """What the window's checkouts expect of each side, summed per bucket in SQL (SUMMARY):
        {side: {bucket: Bucket}}; None when summaries are off."""
        if not self.settings.summaries:
            return None
        rows = await reports(self.pool).fetch(SUMMARY, a, b, buckets)  # the reporting pool: not the saga's
        return summary_of(rows)

    async def _checkouts(self, a: datetime, b: datetime, n: int, *bad: set[int] | None) -> list:
        """The window's checkouts with a key in one of the buckets that disagreed (`bad`: holds,
        orders, charges of `n`); every one when a side has no summary (None); none when every
        bucket agreed."""
        chosen = None if any(x is None for x in bad) else [sorted(x) for x in bad]
        if chosen is not None and not any(chosen):
            return []
        rows: list = []
        at = last = None
        for _ in range(MAX_PAGES):
            # the reporting pool: not the saga's connections
            page = await reports(self.pool).fetch(CHECKOUTS, a, b, at, last, PAGE, n, *(chosen or (None, None, None)))
            rows += page
            if len(page) < PAGE:
                return rows
            at, last = page[-1]["created_at"], page[-1]["id"]
        raise WindowNotAudited(f"more than {MAX_PAGES * PAGE} checkouts in [{a}, {b}): shorten CUTY_AUDIT_WINDOW_SECONDS")

    async def _digest(self, call, request, items: str) -> tuple[list, list]:
        out, extra = [], []
        for _ in range(MAX_PAGES):
            answer = await call(request)
            out += getattr(answer, items)
            if items == "orders":
                extra += answer.duplicates
            if not answer.next_page_token:
                return out, extra
            request.page_token = answer.next_page_token
        raise WindowNotAudited(f"{items}: more than {MAX_PAGES} pages in one window")

    async def _summary(self, call, request) -> dict[int, digests.Bucket] | None:
        """A side's per-bucket summary; None (every row is read) when summaries are off, or the
        service does not answer them yet (an older version, mid-rollout)."""
        if not self.settings.summaries:
            return None
        try:
            answer = await call(request)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.warning("no summary: reading every row", extra={"rpc": type(request).__name__})
            return None
        return {x.bucket: digests.Bucket(x.bucket, x.count, x.fingerprint) for x in answer.buckets}

    async def _hold_summary(self, a: datetime, b: datetime, buckets: int) -> dict[int, digests.Bucket] | None:
        return await self._summary(lambda r: self.booking.SummarizeHolds(r, timeout=self.deadline),
                                   booking_pb2.SummarizeHoldsRequest(start_time=to_timestamp(a),
                                                                     end_time=to_timestamp(b), bucket_count=buckets))

    async def _order_summary(self, a: datetime, b: datetime, buckets: int) -> dict[int, digests.Bucket] | None:
        return await self._summary(lambda r: self.codepool.SummarizeDeliveries(r, timeout=self.deadline),
                                   codepool_pb2.SummarizeDeliveriesRequest(start_time=to_timestamp(a),
                                                                           end_time=to_timestamp(b),
                                                                           bucket_count=buckets))

    async def _holds(self, a: datetime, b: datetime, count: int, buckets: set[int] | None) -> list:
        """The holds of `buckets` (of `count`; None: all) made in [a, b); none read when no bucket
        disagreed."""
        if buckets is not None and not buckets:
            return []
        req = booking_pb2.DigestHoldsRequest(start_time=to_timestamp(a), end_time=to_timestamp(b), page_size=PAGE,
                                             **_drill(count, buckets))
        return (await self._digest(lambda r: self.booking.DigestHolds(r, timeout=self.deadline), req, "holds"))[0]

    async def _orders(self, a: datetime, b: datetime, count: int, buckets: set[int] | None) -> tuple[list, list]:
        """The delivered orders of `buckets` (of `count`; None: all) reserved in [a, b) and their
        codes sold twice; none read when no bucket disagreed."""
        if buckets is not None and not buckets:
            return [], []
        req = codepool_pb2.DigestDeliveriesRequest(start_time=to_timestamp(a), end_time=to_timestamp(b),
                                                   page_size=PAGE, **_drill(count, buckets))
        return await self._digest(lambda r: self.codepool.DigestDeliveries(r, timeout=self.deadline), req, "orders")

    async def _psp_list(self, call, a: datetime, b: datetime) -> list[dict]:
        out: list[dict] = []
        after = ""
        for _ in range(MAX_PAGES):
            page = await call(_epoch(a), _epoch(b), starting_after=after, limit=PSP_PAGE)
            out += page["data"]
            if not page.get("has_more") or not page["data"]:
                return out
            after = page["data"][-1]["id"]
        raise WindowNotAudited(f"PSP list: more than {MAX_PAGES} pages in one window")

    async def _charge_report(self, a: datetime, b: datetime, buckets: int) -> dict[int, digests.Bucket] | None:
        """The PSP's balance report of the charges captured in [a, b) per bucket of the intent id;
        None (every charge is listed) when summaries are off or the PSP has no such report (404)."""
        if not self.settings.summaries:
            return None
        try:
            report = await self.psp.balance_report(_epoch(a), _epoch(b), buckets)
        except PspError as e:
            if e.status != 404 or e.error.get("code") != "route_missing":
                raise
            log.warning("no balance report at the PSP: listing every charge")
            return None
        if report.get("bucket_count") != buckets:
            raise PspError(502, {"code": "report_unexpected", "message": "the balance report has another bucket count"})
        return {int(x["bucket"]): digests.Bucket(int(x["bucket"]), int(x["count"]), int(x["fingerprint"], 16))
                for x in report["buckets"][:buckets]}

    async def _charges(self, a: datetime, b: datetime, n: int, buckets: set[int] | None) -> list[dict]:
        """The charges captured in [a, b) whose intent is in one of `buckets` (of `n`; None: all);
        none listed when every bucket agreed."""
        if buckets is None:
            return await self._psp_list(self.psp.list_charges, a, b)
        if not buckets:
            return []
        if len(buckets) > PSP_DRILL_BUCKETS:  # most of the window: listed whole, kept in the buckets
            return [c for c in await self._psp_list(self.psp.list_charges, a, b)
                    if digests.bucket_of(c["payment_intent"], n) in buckets]
        drill = dict(bucket_count=n, buckets=sorted(buckets))
        return await self._psp_list(lambda *args, **kw: self.psp.list_charges(*args, **kw, **drill), a, b)

    async def _refunds_of(self, a: datetime, b: datetime) -> list[dict]:
        return await self._psp_list(self.psp.list_refunds, a, b)

    # -- money: charges, payments, checkouts ----------------------------------------------------
    async def _money(self, checkouts, charges, by_intent, a, b, looks: "_Looks") -> list[Finding]:
        out: list[Finding] = []
        charge_of = {c["payment_intent"]: c for c in charges}
        # Charges whose payment is not among the window's checkouts: their payment, by intent.
        unknown = [c["payment_intent"] for c in charges if c["payment_intent"] not in by_intent
                   and _epoch(a) <= c["created"] < _epoch(b)]
        found = {}
        if unknown:
            looks.take(len(unknown))
            found = {r["psp_intent_id"]: r for r in await self.pool.fetch(PAYMENTS_BY_INTENT, unknown)}
        for intent in unknown:
            ch, p = charge_of[intent], found.get(intent)
            if p is None:
                out.append(Finding("psp_charge_unknown", ch["id"], f"captured {ch['amount']} {ch['currency']}, "
                                   "no payment of ours has this intent", psp_id=intent))
                continue
            out += self._charge_vs_payment(ch, p["id"], p["status"], p["amount_minor"], p["refund_settled_minor"],
                                           p["checkout_id"], p["checkout_state"], p["merchant_id"])
        # The window's checkouts: each captured payment against its charge.
        missing = []
        for c in checkouts:
            if c["psp_intent_id"] is None or c["pay_status"] not in CAPTURED and c["psp_intent_id"] not in charge_of:
                continue
            ch = charge_of.get(c["psp_intent_id"])
            if ch is None:
                missing.append(c)
                continue
            out += self._charge_vs_payment(ch, c["payment_id"], c["pay_status"], c["pay_amount"],
                                           c["refund_settled_minor"], c["id"], c["state"], c["merchant_id"])
        if missing:  # captured outside [a, b + slack), or never: ask the PSP about each
            looks.take(len(missing))
            intents = await looks.each(missing, lambda c: self._intent(c["psp_intent_id"]))
            for c, intent in zip(missing, intents):
                if intent is None or intent.get("status") != "succeeded":
                    out.append(Finding("charge_missing", str(c["payment_id"]),
                                       f"payment {c['pay_status']} but the PSP has no captured charge "
                                       f"({(intent or {}).get('status', 'no intent')})", checkout_id=str(c["id"]),
                                       payment_id=str(c["payment_id"]), psp_id=c["psp_intent_id"],
                                       merchant_id=c["merchant_id"]))
                    continue
                ch = {"id": "ch_" + intent["id"].split("_", 1)[-1], "payment_intent": intent["id"],
                      "amount": intent["amount"], "amount_refunded": intent.get("amount_refunded", 0),
                      "currency": intent["currency"]}
                out += self._charge_vs_payment(ch, c["payment_id"], c["pay_status"], c["pay_amount"],
                                               c["refund_settled_minor"], c["id"], c["state"], c["merchant_id"])
        return out

    @staticmethod
    def _charge_vs_payment(ch, payment_id, status, amount, refund_settled, checkout_id, checkout_state,
                           merchant_id) -> list[Finding]:
        if status in CAPTURED and ch["amount"] - ch.get("amount_refunded", 0) == amount - refund_settled \
                and (refund_settled or checkout_state in SOLD):
            return []  # the books balance (most charges): nothing to build
        ids = dict(checkout_id=str(checkout_id) if checkout_id else None, payment_id=str(payment_id),
                   psp_id=ch["payment_intent"], merchant_id=merchant_id)
        out = []
        kept_psp = ch["amount"] - ch.get("amount_refunded", 0)
        if status not in CAPTURED:
            out.append(Finding("payment_unresolved", str(payment_id), f"the PSP captured {ch['amount']} "
                               f"{ch['currency']} but the payment is {status}", **ids))
        elif kept_psp != amount - refund_settled:
            out.append(Finding("amount_mismatch", str(payment_id), f"the PSP kept {kept_psp}, the payment says "
                               f"{amount - refund_settled} ({amount} captured, {refund_settled} refunded)", **ids))
        if status in CAPTURED and refund_settled == 0 and checkout_state not in SOLD:
            out.append(Finding("payment_unresolved", str(payment_id), f"captured, nothing refunded, and the "
                               f"checkout is {checkout_state or 'missing'}", **ids))
        return out

    async def _intent(self, intent_id: str) -> dict | None:
        try:
            return await self.psp.get_intent(intent_id)
        except PspError as e:
            if e.status == 404:
                return None
            raise

    async def _refunds(self, refunds: list[dict]) -> list[Finding]:
        if not refunds:
            return []
        ours = {r["psp_refund_id"] for r in await self.pool.fetch(OUR_REFUNDS, [r["id"] for r in refunds])}
        return [Finding("psp_refund_unknown", r["id"], f"the PSP refunded {r['amount']} {r['currency']} that no "
                        "refund of ours records", psp_id=r["payment_intent"]) for r in refunds if r["id"] not in ours]

    # -- bookings --------------------------------------------------------------------------------
    async def _bookings(self, checkouts, holds, a, b, looks: "_Looks") -> list[Finding]:
        out: list[Finding] = []
        hold_of = {h.hold_id: h for h in holds}
        completed = [c for c in checkouts if c["kind"] == "booking" and c["state"] == "COMPLETED" and c["hold_id"]]
        missing = [c for c in completed if c["hold_id"] not in hold_of]
        if missing:  # made outside [a, b + slack) (a reschedule's hold): ask booking about each
            looks.take(len(missing))
            got = await looks.each(missing, lambda c: self._hold(c["hold_id"]))
            for c, h in zip(missing, got):
                if h is not None:
                    hold_of[c["hold_id"]] = h
        for c in completed:
            h = hold_of.get(c["hold_id"])
            why = ("no such hold" if h is None else
                   f"the hold is {booking_pb2.HoldStatus.Name(h.status)}" if h.status != booking_pb2.HOLD_STATUS_CONFIRMED
                   else f"confirmed with {h.payment_ref!r}, not the checkout's {payment_ref(c)!r}"
                   if h.payment_ref != payment_ref(c) else None)
            if why:
                out.append(Finding("hold_not_confirmed", str(c["id"]), f"completed booking: {why}",
                                   checkout_id=str(c["id"]), payment_id=str(c["payment_id"] or "") or None,
                                   other_id=c["hold_id"], merchant_id=c["merchant_id"]))
        # Each confirmed hold of [a, b) belongs to a sold checkout with that hold.
        mine = {c["hold_id"]: c for c in checkouts if c["hold_id"]}
        lone = [h for h in holds if h.status == booking_pb2.HOLD_STATUS_CONFIRMED and not h.cancelled
                and a <= from_timestamp(h.create_time) < b
                and not (h.hold_id in mine and mine[h.hold_id]["state"] in SOLD)]
        if lone:
            refs = [_uuid(h.payment_ref) for h in lone]
            looks.take(len(lone))
            rows = await self.pool.fetch(CHECKOUTS_BY_REF, [r for r in refs if r],
                                         [h.merchant_id for h, r in zip(lone, refs) if r])
            by_ref = {(r["ref"], str(r["hold_id"])): r for r in rows}
            for h in lone:
                c = by_ref.get((h.payment_ref, h.hold_id))
                if c is None or c["state"] not in SOLD:
                    out.append(Finding("hold_without_checkout", h.hold_id, "confirmed hold, " + (
                        "no checkout holds it with that payment" if c is None else f"its checkout is {c['state']}"),
                        checkout_id=str(c["id"]) if c else None, other_id=h.payment_ref, merchant_id=h.merchant_id))
        return out

    async def _hold(self, hold_id: str):
        try:
            return await self.booking.GetHold(booking_pb2.GetHoldRequest(hold_id=hold_id), timeout=self.deadline)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    # -- codes -----------------------------------------------------------------------------------
    async def _codes(self, checkouts, orders, duplicates, a, b) -> list[Finding]:
        out: list[Finding] = []
        order_of = {o.order_id: o for o in orders}
        for c in checkouts:
            if c["kind"] != "codes" or c["state"] != "COMPLETED":
                continue
            o = order_of.get(str(c["order_id"] or c["id"]))
            counted = None if o is None else o.delivered + o.revoked - o.replaced
            if counted != c["quantity"]:
                out.append(Finding("codes_count_mismatch", str(c["id"]), (
                    f"completed, quantity {c['quantity']}, no delivered order" if o is None else
                    f"quantity {c['quantity']}, delivered {o.delivered} + revoked {o.revoked} - replaced "
                    f"{o.replaced} = {counted}"), checkout_id=str(c["id"]), payment_id=str(c["payment_id"] or "") or None,
                    merchant_id=c["merchant_id"]))
        mine = {str(c["order_id"] or c["id"]): c for c in checkouts if c["kind"] == "codes"}
        lone = [o for o in orders if a <= from_timestamp(o.reserve_time) < b
                and not (o.order_id in mine and mine[o.order_id]["state"] in SOLD)]
        if lone:
            rows = await self.pool.fetch(CHECKOUTS_BY_ID, [u for u in (_uuid(o.order_id) for o in lone) if u])
            state_of = {str(r["id"]): r["state"] for r in rows}
            for o in lone:
                state = state_of.get(o.order_id)
                if state not in SOLD:
                    out.append(Finding("codes_without_checkout", o.order_id, f"{o.delivered} code(s) delivered, " + (
                        "no checkout of that id" if state is None else f"its checkout is {state}"),
                        checkout_id=o.order_id if state else None, merchant_id=o.merchant_id))
        for d in duplicates:
            out.append(Finding("code_delivered_twice", d.code_id, "delivered to orders " + ", ".join(d.order_ids),
                               other_id=",".join(d.order_ids)[:300], merchant_id=d.merchant_id))
        return out

    # -- findings --------------------------------------------------------------------------------
    async def _record(self, findings: list[Finding], a: datetime, b: datetime) -> int:
        if not findings:
            return 0
        cols = list(zip(*[(f.kind, f.subject[:300], _uuid(f.checkout_id), _uuid(f.payment_id), f.psp_id,
                           f.other_id, f.merchant_id, f.detail[:2000], a, b) for f in findings]))
        added = await self.pool.fetch(RECORD, *[list(c) for c in cols])
        if self.metrics is not None:
            for r in added:
                self.metrics.audit_findings.labels(r["kind"]).inc()
        return len(added)


def summary_of(rows) -> dict[str, dict[int, digests.Bucket]]:
    """SUMMARY's rows as {side: {bucket: Bucket}}, fingerprints modulo 2^64 (buckets without a fact
    of their side left out)."""
    out: dict[str, dict[int, digests.Bucket]] = {}
    for r in rows:
        if r["n"]:
            out.setdefault(r["side"], {})[r["bucket"]] = digests.Bucket(r["bucket"], r["n"],
                                                                        int(r["fingerprint"] or 0) % digests.MOD)
    return out


def _bucket_count(facts: int) -> int:
    """Buckets for a window of about `facts` facts per side: BUCKET_FACTS each, a power of two."""
    n = MIN_BUCKETS
    while n < digests.MAX_DRILL_BUCKETS and n * BUCKET_FACTS < facts:
        n *= 2
    return n


def _drill(count: int, buckets: set[int] | None) -> dict:
    """A digest request's bucket filter (count <= digests.MAX_DRILL_BUCKETS: every bucket fits);
    None: the whole window."""
    return {} if buckets is None else dict(bucket_count=count, buckets=sorted(buckets))


def _in(checkouts: list, key: str, buckets: set[int] | None) -> list:
    """The checkouts whose `key` bucket is among `buckets` (None: all of them)."""
    return checkouts if buckets is None else [c for c in checkouts if c[key] in buckets]


CANCEL_GRACE_SECONDS = 5.0


async def _gather_all(aws: list) -> list:
    """asyncio.gather that leaves nothing running behind it: when one part fails (or the whole is
    cancelled) the others are cancelled and given CANCEL_GRACE_SECONDS to finish (gather alone
    leaves them running, reading a window nobody will check)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=CANCEL_GRACE_SECONDS)
        raise


class _Looks:
    """The second looks of one window: counted against MAX_SECOND_LOOKS, run a few at a time."""

    def __init__(self) -> None:
        self.taken = 0
        self.gate = asyncio.Semaphore(SECOND_LOOK_CONCURRENCY)

    def take(self, n: int) -> None:
        self.taken += n
        if self.taken > MAX_SECOND_LOOKS:
            raise WindowNotAudited(f"more than {MAX_SECOND_LOOKS} second looks in one window")

    async def each(self, items: Iterable, fn) -> list:
        async def one(x):
            async with self.gate:
                return await fn(x)
        return await _gather_all([one(x) for x in items])


def distinct(checked: list[Checked]) -> list[tuple[Checked, Finding]]:
    """Each violation of audited windows once, with the first window that found it, as the job
    records it (unique per kind and offending id): windows overlap by the slack, so a fact near an
    edge (a code sold twice to orders of two windows) can be seen by both."""
    first: dict[tuple[str, str], tuple[Checked, Finding]] = {}
    for c in checked:
        for f in c.findings:
            first.setdefault((f.kind, f.subject), (c, f))
    return list(first.values())


async def recorded(pool, since: datetime, limit: int = 1000) -> list[dict]:
    """The findings of windows that ended after `since`, oldest first (`ops audit`)."""
    rows = await pool.fetch("SELECT kind, subject, checkout_id, payment_id, psp_id, other_id, "
                            "of_merchant AS merchant_id, detail, window_start, window_end, found_at "
                            "FROM audit_findings WHERE window_end > $1 ORDER BY window_end, id LIMIT $2", since, limit)
    return [dict(r) for r in rows]


def utc(value: str) -> datetime:
    """An RFC 3339 instant (a date alone: its midnight, UTC)."""
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def register(server, pool, core, *, booking_stub=None, codepool_stub=None) -> Auditor:
    """The auditor as a background job of the payments server (payments/bootstrap.py), with its own
    channels to booking and the code pool (payments' identity: `system`)."""
    from cuty.booking.v1 import booking_pb2_grpc
    from cuty.codepool.v1 import codepool_pb2_grpc
    from cutylib.config import grpc_addr_for
    from cutylib.grpc_client import create_channel
    from cutylib.tls import BOOKING, CODEPOOL

    for name, target in (("booking", BOOKING), ("codepool", CODEPOOL)):
        if (booking_stub if name == "booking" else codepool_stub) is None:
            channel = create_channel(grpc_addr_for(name), target, server.transport, deadline_seconds=30.0)
            server.on_stop(channel.close)
            if name == "booking":
                booking_stub = booking_pb2_grpc.BookingServiceStub(channel)
            else:
                codepool_stub = codepool_pb2_grpc.CodePoolServiceStub(channel)
    auditor = Auditor(pool, booking_stub, codepool_stub, core.psp, core.metrics, worker_id=core.worker_id)
    server.add_background(auditor.run)
    return auditor
