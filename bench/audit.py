"""Invariant auditor benchmark (`make bench-audit`): how long the auditor takes to check a day of a
busy platform, and what it costs checkout throughput while it runs.

The stack is the deployed one (real processes, mutual TLS, bench/checkout.py's Side) with its own
periodic auditor off. A day is seeded at BENCH_SCALE of 1,000,000 checkouts (default 0.03: 30,000):
each charge is captured at the PSP simulator through its API (so its list API answers from the
real ledger), then the matching rows are written in SQL into the three databases (growth_fill.py's
merchants and chairs: half bookings with a confirmed hold, half code purchases with a delivered
order). The seeded day is compressed into the minutes its charges took; the auditor's window is
scaled so that each holds what a 10-minute window of a 1,000,000-a-day platform holds (7,000
checkouts), with its slack a fifth of a window (2 of 10 minutes, as deployed).

1. `python -m payments ops audit --since --until` over the day, as the payments pod runs it (its
   identity, payments' own per-bucket sums in SQL, booking's and the code pool's summaries and
   digests over gRPC, the PSP's balance report and list API; how many buckets disagreed and were
   read row by row): the time it reports for the audit itself,
   and the extrapolation to 1,000,000 checkouts (linear: the windows are the production size). It
   must report nothing (the seeded day is consistent). Beside it, the raw statement: the payments
   side's read of the day's checkouts and payments alone, in the same run.
2. Checkout throughput (BENCH_CONCURRENCY buyers, codes and bookings alternately, BENCH_SECONDS per
   round) without the auditor and with it (another process, as a payments replica), alternated in
   BENCH_ROUNDS rounds, in four ways; the ratios with / without (target >= 0.95):
   - keeping pace, as deployed: one production-size window (~7,000 checkouts) each time the buyers
     have sold that many, at most BENCH_PACE_SECONDS (60) apart (closer than a deployment's 10
     minutes only overstates its cost); every variant's round lasts one such period (at least
     BENCH_SECONDS), so that all are measured over the same stretch;
   - catching up a backlog under the job's duty cycle (CUTY_AUDIT_DUTY_CYCLE, 0.1): the day's
     windows one after another, resting as the job does;
   - a day in 60 s: the target read literally, the day's windows audited at the pace of 1,000,000
     checkouts a minute (each window given its checkouts' share of the minute; a window that takes
     longer makes the pace fall short, which the line reports);
   - flat out (the day again and again, no rest): an operator's `ops audit`, or a duty cycle of 1.
   Each line also says how many checkouts a second the auditor audited and its busy share.

All processes share this machine: only the ratios within one run mean much.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone

from _common import Run, all_cpu, bench_postgres, closed_loop, merged, postgres_cpu, report

import asyncpg

import checkout as checkout_bench
from growth_fill import CHAIRS, MERCH, replica
from cutylib.testing.procs import as_service_role
from payments.audit import SUMMARY
from payments.psp import PspClient

SCALE = float(os.environ.get("BENCH_SCALE", "0.03"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "30"))
# Keeping pace: at most this many seconds between windows (a deployment's are a window's time apart)
PACE_SECONDS = float(os.environ.get("BENCH_PACE_SECONDS", "60"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
PER_WINDOW = 7000  # a 10-minute window of a platform selling 1,000,000 a day
DAY = 1_000_000
SEED_CONCURRENCY = 64
TARGET_DAY_SECONDS = 60.0  # the target: a day of 1,000,000 checked in under a minute
HOLD_OFFSET_SECONDS = 0.005  # a hold or an order after its checkout, in a deployment

# Checkout n of the day (the arrays: id, its creation, its PSP intent, n): even n a booking (hold
# md5('hold' || id), on chair n % CHAIRS at its own hour), odd n a code purchase (order = the
# checkout id, one code); the merchant is the chair's (growth_fill.MERCH).
DAY_ROWS = f"""
FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::int[]) AS c (id, at, intent, n),
     LATERAL (SELECT {MERCH.format(r=f'(c.n % {CHAIRS})')} AS m,
                     CASE WHEN c.n % 2 = 0 THEN 'booking' ELSE 'codes' END AS kind,
                     CASE WHEN c.n % 2 = 0 THEN 75000 ELSE 2500 END AS amount) x
"""
FILL_CHECKOUTS = f"""
INSERT INTO checkouts (id, customer_id, kind, state, slot_id, product_id, quantity, hold_id, order_id, amount_minor,
                       currency, expire_time, payment_key, payment_id, payment_method, created_at, updated_at,
                       merchant_id, salon_id, free_cancellation_hours, cancellation_fee_percent, start_time)
SELECT c.id, 'cust-' || c.n, x.kind, 'COMPLETED', CASE WHEN x.kind = 'booking' THEN md5('slot' || c.id)::uuid END,
       CASE WHEN x.kind = 'codes' THEN md5('product' || x.m)::uuid END, 1,
       CASE WHEN x.kind = 'booking' THEN md5('hold' || c.id)::uuid::text END,
       CASE WHEN x.kind = 'codes' THEN c.id END, x.amount, 'TRY', c.at + interval '10 minutes',
       md5('key' || c.id)::uuid, md5('pay' || c.id)::uuid, 'pm_card_ok', c.at, c.at + interval '2 seconds', x.m,
       CASE WHEN x.kind = 'booking' THEN md5('salon-' || x.m)::uuid END,
       CASE WHEN x.kind = 'booking' THEN 24 END, CASE WHEN x.kind = 'booking' THEN 0 END,
       CASE WHEN x.kind = 'booking' THEN c.at + interval '3 days' END
{DAY_ROWS}"""
FILL_PAYMENTS = f"""
INSERT INTO payments (id, checkout_id, customer_id, status, version, psp_intent_id, amount_minor, currency,
                      payment_method, idempotency_key, created_at, updated_at, merchant_id)
SELECT md5('pay' || c.id)::uuid, c.id, 'cust-' || c.n, 'succeeded', 3, c.intent, x.amount, 'TRY', 'pm_card_ok',
       md5('key' || c.id)::uuid::text, c.at, c.at + interval '1 second', x.m
{DAY_ROWS}"""
FILL_HOLDS = f"""
INSERT INTO holds (id, slot_id, salon_id, resource_id, customer_id, request_id, status, start_time, end_time,
                   price_minor, currency, expires_at, payment_ref, created_at, updated_at, merchant_id)
SELECT md5('hold' || c.id)::uuid, md5('slot' || c.id)::uuid, md5('salon-' || x.m)::uuid,
       md5('res' || (c.n % {CHAIRS}))::uuid, 'cust-' || c.n, 'req-' || c.id, 'confirmed', t.s, t.s + interval '1 hour',
       75000, 'TRY', c.at + interval '10 minutes', md5('pay' || c.id)::uuid::text, c.at + make_interval(secs => $6),
       c.at + interval '1 second', x.m
{DAY_ROWS}, LATERAL (SELECT $5::timestamptz + make_interval(hours => c.n / {CHAIRS}) AS s) t
WHERE x.kind = 'booking'"""
FILL_RESERVATIONS = f"""
INSERT INTO reservations (merchant_id, order_id, order_item_id, product_id, customer_id, quantity, unit_price_minor,
                          currency, status, reserved_at, expires_at, delivered_at, payment_transaction_id)
SELECT x.m, c.id::text, c.id::text || '/1', md5('product' || x.m)::uuid, 'cust-' || c.n, 1, 2500, 'TRY', 'delivered',
       c.at + make_interval(secs => $5), c.at + interval '15 minutes', c.at + interval '1 second',
       md5('pay' || c.id)::uuid::text
{DAY_ROWS} WHERE x.kind = 'codes'"""
FILL_DELIVERIES = f"""
INSERT INTO deliveries (merchant_id, order_id, order_item_id, product_id, customer_id, code_id, status, reserved_at,
                        delivered_at)
SELECT x.m, c.id::text, c.id::text || '/1', md5('product' || x.m)::uuid, 'cust-' || c.n, md5('code' || c.id)::uuid,
       'delivered', c.at + make_interval(secs => $5), c.at + interval '1 second'
{DAY_ROWS} WHERE x.kind = 'codes'"""
RAW = """
SELECT c.id, c.kind, c.state, c.quantity, c.hold_id, c.order_id, c.payment_id, p.status, p.psp_intent_id,
       p.amount_minor, p.refund_settled_minor
FROM checkouts c LEFT JOIN payments p ON p.id = c.payment_id WHERE c.created_at >= $1 AND c.created_at < $2"""


async def seed_psp(psp_url: str, n: int) -> list[tuple[str, float, int]]:
    """n captured charges, made through the simulator's API: (intent id, its capture time, n), in
    the order of their captures. The checkouts are then seeded a moment (2 ms) before their charge's
    capture: a day compressed into minutes would otherwise put the simulator's settle delay (200 ms)
    of a small window's share across its edge, far more often than a deployment's 10-minute windows
    see it (edge crossers are read row by row, as they should be; the bench would only measure more
    of them than a deployment meets)."""
    psp = PspClient(psp_url, timeout=30, retries=2, max_connections=SEED_CONCURRENCY)
    made: list[tuple[str, float, int]] = []
    counter = iter(range(n))

    async def worker():
        for i in counter:
            at = time.time()
            intent = await psp.create_intent(str(uuid.uuid4()), {
                "amount": 75000 if i % 2 == 0 else 2500, "currency": "TRY",
                # captured a moment later, with no webhook: payments is not the subject here
                "payment_method": "pm_card_no_webhook"})
            made.append((intent["id"], at, i))
    try:
        await asyncio.gather(*(worker() for _ in range(SEED_CONCURRENCY)))
        await asyncio.sleep(1.0)  # the last ones settle (pm_card_no_webhook: 200 ms)
        captured: dict[str, float] = {}
        after = ""
        while True:  # their capture times, from the list API
            page = await psp.list_charges(min(m[1] for m in made) - 1, time.time() + 1, starting_after=after,
                                          limit=1000)
            captured.update((c["payment_intent"], c["created"]) for c in page["data"])
            if not page["has_more"]:
                break
            after = page["data"][-1]["id"]
    finally:
        await psp.aclose()
    assert len(captured) >= n, f"{len(captured)} of {n} charges captured"
    return sorted(((intent, captured[intent], i) for intent, _, i in made), key=lambda m: m[1])


async def seed_dbs(dbs: dict[str, str], made: list[tuple[str, float, int]]) -> None:
    ids = [uuid.uuid4() for _ in made]
    ats = [datetime.fromtimestamp(at - 0.002, timezone.utc) for _, at, _ in made]
    arrays = (ids, ats, [m[0] for m in made], [m[2] for m in made])
    far = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + timedelta(days=400)
    # A hold or an order is made a moment after its checkout (HOLD_OFFSET_SECONDS in a deployment),
    # compressed as the day is: uncompressed, the seeded day's density put ~300 times as many holds
    # and orders across a window's edge from their checkouts as a deployment's windows meet, each
    # an edge crosser read row by row.
    offset = HOLD_OFFSET_SECONDS * (DAY / 86400) * (made[-1][1] - made[0][1]) / max(1, len(made) - 1)
    for svc, statements in (("payments", [(FILL_CHECKOUTS,), (FILL_PAYMENTS,)]), ("booking", [(FILL_HOLDS, far, offset)]),
                            ("codepool", [(FILL_RESERVATIONS, offset), (FILL_DELIVERIES, offset)])):
        conn = await asyncpg.connect(dbs[svc])
        try:
            await replica(conn)
            for sql, *extra in statements:
                await conn.execute(sql, *arrays, *extra)
            await conn.execute("ANALYZE")
        finally:
            await conn.close()


def audit_env(side, window: float) -> dict[str, str]:
    env = as_service_role("payments", dict(side.stack.procs["payments-0"].env))
    env.update(CUTY_AUDIT_WINDOW_SECONDS=repr(window), CUTY_AUDIT_SLACK_SECONDS=repr(window / 5),
               CUTY_LOG_LEVEL="WARNING")
    return env


def run_audit(env: dict[str, str], since: datetime, until: datetime) -> tuple[float, str, int]:
    """`ops audit` over [since, until): (the seconds it reports for the audit, its summary line, exit code)."""
    out = subprocess.run([sys.executable, "-m", "payments", "ops", "audit", "--since", since.isoformat(),
                          "--until", until.isoformat(), "--timings"], env=env, capture_output=True, text=True,
                         timeout=3600)
    lines = out.stderr.splitlines()
    summary = "\n".join(line for line in lines if line.startswith(("audited ", "  window", "  buckets")))
    summary = summary or out.stderr[-500:]
    head = summary.splitlines()[0]
    took = float(head.rsplit(" in ", 1)[1].rstrip("s")) if " in " in head else float("nan")
    return took, summary, out.returncode


async def main() -> None:
    n = max(2000, int(DAY * SCALE))
    server = bench_postgres()
    work = tempfile.mkdtemp(prefix="cuty-bench-audit-")
    checkout_bench.ENV["CUTY_AUDIT_INTERVAL_SECONDS"] = 0  # the stack's own auditor off: the bench runs it
    side = checkout_bench.Side(server, work, secure=True)
    results = []
    try:
        # slots and codes for every round's buyers (up to 100 checkouts a second, half of each
        # kind, and a margin): buyers that ran out would fail fast and void the ratios
        need = int(100 * (3 + ROUNDS * 4 * max(SECONDS, PACE_SECONDS)))
        checkout_bench.SLOTS_PER_RUN = max(checkout_bench.SLOTS_PER_RUN, need)
        slots = max(CONCURRENCY * 400, need)
        await side.start(slots, 2)
        t0 = time.perf_counter()
        made = await seed_psp(side.stack.psp_url, n)
        seeded_for = time.perf_counter() - t0
        await seed_dbs(side.dbs, made)
        since = datetime.fromtimestamp(made[0][1] - 1, timezone.utc)
        until = datetime.fromtimestamp(made[-1][1] + 1, timezone.utc)
        window = max(0.05, (until - since).total_seconds() * PER_WINDOW / n)
        print(f"seeded {n:,} checkouts (PSP charges in {seeded_for:.0f}s); audit window {window:.2f}s "
              f"(~{PER_WINDOW} checkouts, as 10 minutes at 1,000,000 a day)", file=sys.stderr)
        env = audit_env(side, window)

        # 1. The day, audited: the figure at this scale and its extrapolation.
        # Twice: the first pays a fresh process's costs (connections, TLS, first compiles, cold
        # caches), the second is what a running replica pays; the extrapolation is from the second.
        cold, summary, _ = await asyncio.to_thread(run_audit, env, since, until)
        print(summary, file=sys.stderr)
        took, summary, code = await asyncio.to_thread(run_audit, env, since, until)
        print(summary, file=sys.stderr)
        # The same, every row read (CUTY_AUDIT_SUMMARIES=0, the design before the summaries), right
        # after: the ratio of the two is what the summaries save on this machine now
        rows_env = {**env, "CUTY_AUDIT_SUMMARIES": "0"}
        rows_took, summary, rows_code = await asyncio.to_thread(run_audit, rows_env, since, until)
        print(summary, file=sys.stderr)
        pool = await asyncpg.create_pool(side.dbs["payments"], min_size=1, max_size=2)
        t = time.perf_counter()
        raw_rows = len(await pool.fetch(RAW, since, until))
        raw = time.perf_counter() - t
        # payments' own side of the summaries alone: the same statement the auditor runs per window,
        # over the day's windows
        t = time.perf_counter()
        w, at = timedelta(seconds=window), since
        while at < until:
            await pool.fetch(SUMMARY, at, min(at + w, until), 1024)
            at += w
        own_summary = time.perf_counter() - t
        await pool.close()
        extrapolated = took * DAY / n
        results.append(Run(ops=n, seconds=took, latencies_ms=[took * 1000]).result(
            f"audit a day: {n:,} checkouts (exit {code}: {'clean' if code == 0 else 'FINDINGS'})", 1,
            notes="ops_per_s = checkouts audited per second; limit: the raw read of the day's checkouts",
            seconds=round(took, 2), first_run_seconds=round(cold, 2), extrapolated_1m_checkouts_s=round(extrapolated, 1),
            target_s=60,
            raw_statement_s=round(raw, 3), raw_rows=raw_rows, own_summary_statements_s=round(own_summary, 3),
            every_row_read_s=round(rows_took, 2),
            every_row_read_exit=rows_code))
        results[-1].limit_ops_per_s = round(raw_rows / raw, 1) if raw else None
        results[-1].ratio_to_limit = round((n / took) / (raw_rows / raw), 3) if raw and took else None

        # Where an audit's CPU goes: a warmed auditor process audits the day once, with no buyers;
        # each process's CPU over it (the stack's services, Postgres and its share per database,
        # the auditor) per checkout.
        per_checkout, once_seconds = await audit_cpu(side, server, env, since, until)
        rows_cpu, _ = await audit_cpu(side, server, rows_env, since, until)
        results.append(Run(ops=n, seconds=once_seconds, latencies_ms=[once_seconds * 1000]).result(
            f"audit a day, every row read, CPU per checkout audited (us), {n:,} checkouts", 1,
            notes="CUTY_AUDIT_SUMMARIES=0: every side read whole (checkouts, digests, the PSP's charges), as before the summaries",
            **{k: round(v, 1) for k, v in rows_cpu.items()}))
        results.append(Run(ops=n, seconds=once_seconds, latencies_ms=[once_seconds * 1000]).result(
            f"audit a day, CPU per checkout audited (us), {n:,} checkouts", 1,
            notes="each process's CPU over one warm audit of the day, alone on the stack",
            **{k: round(v, 1) for k, v in per_checkout.items()}))
        print("CPU per checkout audited (us): " + ", ".join(f"{k} {v:.1f}" for k, v in per_checkout.items()),
              file=sys.stderr)

        # 2. Checkout throughput without the auditor and with it, in four ways, alternated in
        # rounds: keeping pace (as deployed), catching up under its duty cycle (a backlog, as the
        # job does), at the target's pace (a day in 60 s), flat out (an operator's `ops audit`, or
        # a duty cycle of 1).
        variants = ("without", "keeping pace", "catching up", "a day in 60 s", "flat out")
        runs = {v: [] for v in variants}
        audited = {v: 0 for v in variants}
        busy = {v: 0.0 for v in variants}
        warm = [checkout_bench.buyer(kind, "one-call", side, side.products[0], []) for kind in ("booking", "codes")]
        pace = (await closed_loop(lambda i: warm[i % 2](i), concurrency=CONCURRENCY, duration=3)).ops_per_s
        # as deployed: one window (what a 10-minute window of a 1,000,000-a-day platform holds) each
        # time the buyers have sold that many, at most PACE_SECONDS apart (more often than that
        # only overstates its cost). Every variant's round lasts at least one such period, so that
        # all of them are measured over the same stretch (a longer round sells into fuller tables).
        period = min(PACE_SECONDS, PER_WINDOW / max(pace, 1.0))
        seconds = max(SECONDS, period)
        for rnd in range(ROUNDS):
            for variant in (variants if rnd % 2 == 0 else variants[::-1]):
                auditor = None
                if variant != "without":  # another process, as a payments replica runs it
                    mode = {"keeping pace": "pace", "catching up": "duty", "a day in 60 s": "day",
                            "flat out": "flat"}[variant]
                    auditor = subprocess.Popen([sys.executable, __file__, "--loop", since.isoformat(), until.isoformat(),
                                                mode, repr(period if mode == "pace" else 0.0)], env=env,
                                               stdout=subprocess.PIPE, text=True)
                    # measured once it is auditing, not while it starts (imports, connections)
                    ready = await asyncio.to_thread(auditor.stdout.readline)
                    assert ready.startswith("ready"), ready
                buyers = [checkout_bench.buyer(kind, "one-call", side, side.products[1], [])
                          for kind in ("booking", "codes")]

                async def purchase(i: int) -> None:
                    await buyers[i % 2](i)
                run = await closed_loop(purchase, concurrency=CONCURRENCY, duration=seconds)
                runs[variant].append(run)
                if auditor is not None:
                    auditor.kill()  # mid-audit: it only reads
                    out, _ = auditor.communicate(timeout=30)
                    for line in out.splitlines():
                        if line.startswith("audited "):  # audited <n> checkouts, working <s>s
                            audited[variant] += int(line.split()[1])
                            busy[variant] += float(line.rsplit(" ", 1)[1].rstrip("s"))
        without = merged(runs["without"])
        results.append(without.result("checkouts (codes and bookings, one-call), no auditor", CONCURRENCY))
        for variant in variants[1:]:
            r = merged(runs[variant])
            results.append(r.result(f"checkouts, the auditor {variant}", CONCURRENCY, limit=without,
                                    notes="ratio: with / without the auditor (target >= 0.95)",
                                    checkouts_audited_per_s=round(audited[variant] / r.seconds, 1),
                                    auditor_busy_share=round(busy[variant] / r.seconds, 3)))
        report("audit", results)
        print(f"\nauditor: {n:,} checkouts in {took:.2f}s (first run {cold:.2f}s) -> 1,000,000 in ~{extrapolated:.0f}s "
              f"(target 60s: {'met' if extrapolated < 60 else 'NOT met'}); "
              f"raw read of the day's checkouts {raw:.3f}s; payments' own summary statements over the day "
              f"{own_summary:.3f}s")
        for variant in variants[1:]:
            r = merged(runs[variant])
            ratio = r.ops_per_s / without.ops_per_s
            rate = audited[variant] / r.seconds
            if variant == "flat out":
                verdict = ", not the deployed job"
            elif variant == "a day in 60 s":  # the literal target: both at once
                verdict = f" and >= {DAY / TARGET_DAY_SECONDS:,.0f} audited/s: " + (
                    "met" if ratio >= 0.95 and rate >= DAY / TARGET_DAY_SECONDS else "NOT met")
            else:
                verdict = ": " + ("met" if ratio >= 0.95 else "NOT met")
            print(f"checkout throughput with the auditor {variant} / without: {ratio:.3f} (target >= 0.95{verdict})"
                  f"; it audited {rate:,.0f} checkouts/s, busy {busy[variant] / r.seconds:.0%} of the time")
        print(f"the same audit reading every row (CUTY_AUDIT_SUMMARIES=0): {rows_took:.2f}s (exit {rows_code}); "
              f"summaries / every row: {took / rows_took:.3f} of the time")
        total = per_checkout["total"]
        print(f"CPU per checkout audited, all processes: {total:.1f} us ("
              + ", ".join(f"{k} {v:.1f}" for k, v in per_checkout.items() if k != "total")
              + f"); a day of 1,000,000 in 60 s takes {total * DAY / 60 / 1e6:.2f} cores while it runs; "
              f"every row read: {rows_cpu['total']:.1f} us ("
              + ", ".join(f"{k} {v:.1f}" for k, v in rows_cpu.items() if k != "total") + ")")
        print("the target's figures: the day's audit (1,000,000 in under 60 s, flat out as `ops audit` runs it) and "
              "the deployed job's cost while it runs (keeping pace, and catching up under CUTY_AUDIT_DUTY_CYCLE="
              f"{os.environ.get('CUTY_AUDIT_DUTY_CYCLE', '0.1')})")
    finally:
        await side.stop()
        server.close()


async def audit_cpu(side, server, env: dict[str, str], since: datetime, until: datetime
                    ) -> tuple[dict[str, float], float]:
    """Microseconds of CPU per checkout audited, by process, over one audit of the day by a warmed
    auditor (`--loop ... once`); and the seconds that audit took."""
    proc = subprocess.Popen([sys.executable, __file__, "--loop", since.isoformat(), until.isoformat(), "once", "0"],
                            env=env, stdout=subprocess.PIPE, text=True)
    ready = await asyncio.to_thread(proc.stdout.readline)
    assert ready.startswith("ready"), ready
    before = {**all_cpu(side.stack, server), **postgres_by_database(server)}
    line = await asyncio.to_thread(proc.stdout.readline)
    after = {**all_cpu(side.stack, server), **postgres_by_database(server)}
    await asyncio.to_thread(proc.wait, 60)
    _, count, own, took = line.split()
    checkouts = max(1, int(count))
    out = {"auditor": float(own) * 1e6 / checkouts}
    for name in sorted(after):
        if name != "client" and after[name] - before.get(name, 0.0) > 0:
            out[name] = (after[name] - before.get(name, 0.0)) * 1e6 / checkouts
    out["total"] = sum(v for k, v in out.items() if not k.startswith("postgres "))  # those split "postgres"
    return out, float(took)


def postgres_by_database(server) -> dict[str, float]:
    """Postgres' CPU seconds so far by database ("postgres <db>"), from each backend's process title
    ("postgres: <user> <db> <client> <state>"); the cluster's own processes as "postgres -"."""
    out: dict[str, float] = {}
    for pid, seconds in postgres_cpu(server).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode("utf-8", "replace").split()
        except OSError:
            continue
        client = title[3] if len(title) > 3 and title[0] == "postgres:" else ""
        db = title[2] if "(" in client or client == "[local]" else "-"
        out[f"postgres {db}"] = out.get(f"postgres {db}", 0.0) + seconds
    return out


async def audit_loop(since: str, until: str, mode: str, period: float) -> None:
    """`--loop`: audit [since, until) window by window, again and again until killed (the 'with'
    rounds). `pace`: one window each `period` seconds (a replica keeping pace with the sales);
    `duty`: under the job's duty cycle (CUTY_AUDIT_DUTY_CYCLE: a replica catching up a backlog);
    `flat`: flat out; `once`: the day once, flat out, then its CPU. Prints each window's checkouts and
    the seconds it worked on it."""
    from payments.audit import AuditSettings, utc
    from payments.ops.cli import _connect, pod_auditor

    pool = await _connect()
    settings = AuditSettings.from_env()
    a, b = utc(since), utc(until)
    step = timedelta(seconds=settings.window_seconds)
    async with pod_auditor(pool, settings) as auditor:
        await auditor.audit_range(a, min(a + step, b))  # connections up, first compiles done
        auditor.duty.free_at = 0.0  # the round begins with a window, not a rest (the costlier phase)
        print("ready", flush=True)
        if mode == "once":  # the day once, flat out: the CPU of this process over it
            t0, c0 = time.perf_counter(), os.times()
            checked = await auditor.audit_range(a, b)
            c1 = os.times()
            print(f"once {sum(c.checkouts for c in checked)} {c1.user + c1.system - c0.user - c0.system:.3f} "
                  f"{time.perf_counter() - t0:.3f}", flush=True)
            return
        due = time.perf_counter()  # "day": when the checkouts audited so far were due, at the target's pace
        while True:
            t = a
            while t < b:
                rest = auditor.duty.wait() if mode == "duty" else 0.0
                t0 = time.perf_counter()
                (checked,) = await auditor.audit_range(t, min(t + step, b), paced=mode == "duty")
                took = time.perf_counter() - t0
                print(f"audited {checked.checkouts} checkouts, working {max(0.0, took - rest):.3f}s", flush=True)
                if mode == "pace":
                    await asyncio.sleep(max(0.0, period - took))
                elif mode == "day":  # the target's pace, kept over the windows: a checkout each 60 s / 1,000,000
                    due += checked.checkouts * TARGET_DAY_SECONDS / DAY
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                t += step


if __name__ == "__main__":
    if sys.argv[1:2] == ["--loop"]:
        asyncio.run(audit_loop(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])))
    else:
        asyncio.run(main())
