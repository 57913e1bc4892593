"""The operator's view: `python -m payments ops <command>`, run in a payments pod.

The command line: its arguments, the database pool, the answers and exit codes (the commands are
described in the package's docstring, payments/ops/__init__.py)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time

import asyncpg

from .actions import refund, retry
from .queries import jsonable, story, stuck
from .render import render, render_stuck

DEFAULT_STUCK_SECONDS = 60.0


async def _connect():
    from cutylib.config import database_url_for
    from cutylib.db import ALL_MERCHANTS, create_pool

    # The operator's commands act on any merchant's checkout (each names the one it acts on).
    return await create_pool(database_url_for("payments"), min_size=1, max_size=2,
                             application_name="cuty-payments-ops", merchant=ALL_MERCHANTS)


def _dump(data) -> str:
    return json.dumps(data, indent=2, default=jsonable)


async def _run(args) -> int:
    import grpc

    from ..operator import clean_name

    pool = await _connect()
    try:
        if args.command == "story":
            found = await story(pool, args.id)
            if args.json:
                print(_dump([s.to_json() for s in found]))
            else:
                print("\n\n".join(render(s) for s in found) if found else
                      f"nothing found for {args.id!r} (tried: checkout id, payment id, PSP intent id, "
                      "payment attempt id, checkout Idempotency-Key)")
            return 0 if found else 1
        if args.command == "stuck":
            rows = await stuck(pool, args.older_than, args.limit)
            print(_dump(rows) if args.json else render_stuck(rows, args.older_than))
            return 0
        if args.command == "audit":
            return await _audit(pool, args)
        by = clean_name(args.by)
        try:
            if args.command == "retry":
                c = await retry(args.addr, args.id, by)
                from cuty.payments.v1 import checkout_pb2
                print(f"checkout {c.id} is {checkout_pb2.CheckoutState.Name(c.state)} again, due now "
                      f"(recorded as retried by ops:{by}); follow it with: python -m payments ops story {c.id}")
                return 0
            from cuty.payments.v1 import payments_pb2
            checkout_id, p = await refund(args.addr, pool, args.id, by, args.reason, args.force)
            print(f"payment {p.id} is {payments_pb2.PaymentStatus.Name(p.status)} (recorded as refund requested "
                  f"by ops:{by})")
            if checkout_id:
                print(f"if checkout {checkout_id} is NEEDS_ATTENTION, `python -m payments ops retry {checkout_id} "
                      f"--by {by}` lets the saga finish (it finds the refund done)")
            return 0
        except grpc.aio.AioRpcError as e:
            print(f"{e.code().name}: {e.details()}", file=sys.stderr)
            return 1
        except (LookupError, PermissionError) as e:
            print(f"refused: {e}", file=sys.stderr)
            return 2
    finally:
        await pool.close()


async def _audit(pool, args) -> int:
    """Check [since, until) now and print what is found (--recorded: print what the periodic job
    recorded for the windows ending after `since`); exit 0 when nothing, 3 when something."""
    from datetime import timedelta

    from .. import audit

    since = audit.utc(args.since)
    if args.recorded:
        found = await audit.recorded(pool, since, args.limit)
    else:
        settings = audit.AuditSettings.from_env()
        now = await pool.fetchval("SELECT clock_timestamp()")
        until = audit.utc(args.until) if args.until else now - timedelta(seconds=settings.settle_seconds
                                                                           if args.settle is None else args.settle)
        checked, took = await audit_now(pool, since, until, settings)
        print(f"audited {len(checked)} window(s) of [{since.isoformat()}, {until.isoformat()}): "
              f"{sum(c.checkouts for c in checked)} checkouts, {sum(c.charges for c in checked)} PSP charges, "
              f"{sum(c.holds for c in checked)} confirmed holds, {sum(c.orders for c in checked)} delivered orders "
              f"in {took:.2f}s", file=sys.stderr)
        print(f"  buckets read row by row (disagreeing): holds {sum(c.drilled.get('holds', 0) for c in checked)}, "
              f"orders {sum(c.drilled.get('orders', 0) for c in checked)}, "
              f"charges {sum(c.drilled.get('charges', 0) for c in checked)}, of {sum(c.buckets for c in checked)} "
              f"per side; checkouts read row by row {sum(c.rows for c in checked)}", file=sys.stderr)
        if args.timings:
            for c in checked:
                print(f"  window {c.start.isoformat()}: {c.checkouts} checkouts, seconds {c.timings}", file=sys.stderr)
        found = [{"kind": f.kind, "subject": f.subject, "checkout_id": f.checkout_id, "payment_id": f.payment_id,
                  "psp_id": f.psp_id, "other_id": f.other_id, "merchant_id": f.merchant_id, "detail": f.detail,
                  "window_start": c.start, "window_end": c.end} for c, f in audit.distinct(checked)][:args.limit]
    if args.json:
        print(_dump(found))
    else:
        for f in found:
            ids = " ".join(f"{k}={f[k]}" for k in ("checkout_id", "payment_id", "psp_id", "other_id", "merchant_id")
                           if f[k])
            print(f"{f['kind']:24} {f['subject']}  {ids}  ({f['detail']})")
        print(f"{len(found)} finding(s)", file=sys.stderr)
    return 3 if found else 0


async def audit_now(pool, since, until, settings):
    """The auditor's checks over [since, until) from this process, as the payments identity (its
    certificate: `system` at booking and the code pool): (the windows checked, seconds taken)."""
    async with pod_auditor(pool, settings) as auditor:
        t0 = time.perf_counter()
        checked = await auditor.audit_range(since, until)
        return checked, time.perf_counter() - t0


@contextlib.asynccontextmanager
async def pod_auditor(pool, settings):
    """An Auditor with channels to booking and the code pool as the payments identity, and a PSP
    client, closed on exit."""
    from cuty.booking.v1 import booking_pb2_grpc
    from cuty.codepool.v1 import codepool_pb2_grpc
    from cutylib.config import grpc_addr_for
    from cutylib.grpc_client import create_channel
    from cutylib.tls import BOOKING, CODEPOOL, PAYMENTS, Transport

    from .. import audit
    from ..psp import PspClient

    transport = Transport.from_env(PAYMENTS)
    psp = PspClient(_psp_url(), timeout=30.0)
    async with create_channel(grpc_addr_for("booking"), BOOKING, transport, deadline_seconds=60) as bch, \
            create_channel(grpc_addr_for("codepool"), CODEPOOL, transport, deadline_seconds=60) as cch:
        try:
            yield audit.Auditor(pool, booking_pb2_grpc.BookingServiceStub(bch),
                                codepool_pb2_grpc.CodePoolServiceStub(cch), psp, settings=settings)
        finally:
            await psp.aclose()


def _psp_url() -> str:
    from cutylib.config import Settings

    return Settings().psp_url


def main(argv: list[str]) -> int:
    from cutylib.config import grpc_addr_for
    from cutylib.errors import DomainError

    parser = argparse.ArgumentParser(prog="python -m payments ops", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("story", help="everything about one checkout / payment, whichever id you have")
    st.add_argument("id", help="checkout id, payment id, PSP intent id (pi_...), payment attempt id or "
                               "a checkout Idempotency-Key")
    st.add_argument("--json", action="store_true", help="machine-readable")
    sk = sub.add_parser("stuck", help="checkouts in a non-terminal state (NEEDS_ATTENTION included) for too long")
    sk.add_argument("--older-than", type=float, default=DEFAULT_STUCK_SECONDS, metavar="SECONDS",
                    help=f"in their state for longer than this (default {DEFAULT_STUCK_SECONDS:g})")
    sk.add_argument("--limit", type=int, default=200)
    sk.add_argument("--json", action="store_true")
    addr = grpc_addr_for("payments")
    rt = sub.add_parser("retry", help="put a NEEDS_ATTENTION checkout back to the step that kept failing")
    rt.add_argument("id", help="checkout id")
    rt.add_argument("--by", required=True, help="who is doing this (recorded in the timeline)")
    rt.add_argument("--addr", default=addr, help=f"payments gRPC address (default {addr})")
    rf = sub.add_parser("refund", help="refund a captured payment in full (idempotent)")
    rf.add_argument("id", help="payment id")
    rf.add_argument("--by", required=True, help="who is doing this (recorded in the timeline)")
    rf.add_argument("--reason", default="", help="why (recorded in the timeline)")
    rf.add_argument("--force", action="store_true", help="also when the checkout is not refunding "
                                                         "(e.g. a completed booking given back as a goodwill refund)")
    rf.add_argument("--addr", default=addr, help=f"payments gRPC address (default {addr})")
    au = sub.add_parser("audit", help="check that payments, booking, the code pool and the PSP agree from a time "
                                      "on, and print the offending ids (exit 3 when there are any)")
    au.add_argument("--since", required=True, help="RFC 3339 instant (or a date) the check starts at")
    au.add_argument("--until", default="", help="where it ends (default: now minus the settle time)")
    au.add_argument("--settle", type=float, default=None, metavar="SECONDS",
                    help="leave out checkouts younger than this (default CUTY_AUDIT_SETTLE_SECONDS, 900)")
    au.add_argument("--recorded", action="store_true", help="print what the periodic auditor recorded for the "
                                                            "windows ending after --since; check nothing")
    au.add_argument("--limit", type=int, default=1000)
    au.add_argument("--timings", action="store_true", help="print where each window's time went")
    au.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except DomainError as e:
        print(f"{e.code.name}{f' ({e.field})' if e.field else ''}: {e.message}", file=sys.stderr)
        return 2
    except (OSError, asyncpg.PostgresError) as e:
        print(f"cannot reach the payments database: {e}", file=sys.stderr)
        return 1
