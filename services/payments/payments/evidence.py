"""Chargeback evidence: one JSON document per order, `python -m payments evidence`, in a payments pod.

    python -m payments evidence <checkout id | payment id | PSP intent id | ...>... --by <you> [--out DIR]

Each document joins what each service knows, each read by its owner (no service reads another's
database): the order, its payments, refunds, PSP webhooks and payment timeline from the payments
database (the same lookup as `ops story`), and for a code order the code pool's part through its
system-only RPC `GetOrderEvidence` (the reservation, the codes masked, who read them and when: the
buyer's `read_delivered` is the proof of delivery), called as the payments identity. A booking's
facts (slot, hold, times) are on the checkout row. Every export is recorded: in payments'
`operator_reads` and in the code pool's audit log (`operator_read` by `ops:<you>`).
With `--out DIR`, each document is DIR/<checkout id>.json; otherwise one JSON object a line.
docs/payments.md, "Chargeback evidence".
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
from datetime import datetime, timezone
from typing import Any

import asyncpg

from .ops import Story, story
from .operator import AUDIT_OPERATOR_READ

SCHEMA = "cuty.chargeback-evidence/1"
ORDER_FIELDS = ("id", "kind", "merchant_id", "customer_id", "state", "outcome", "failure_reason", "amount_minor",
                "currency", "payment_method", "product_id", "quantity", "order_id", "slot_id", "hold_id",
                "expire_time", "created_at", "updated_at")
REFUNDS = """
SELECT id, payment_id, amount_minor, currency, reason, requested_by, status, psp_refund_id, failure_reason,
       created_at, updated_at
FROM refunds WHERE payment_id = ANY($1::uuid[]) ORDER BY created_at
"""


def document(s: Story, refunds: list[dict], codes: dict | None, *, by: str, now: datetime) -> dict[str, Any]:
    """The evidence of one order (a story with a checkout), as exported."""
    c = s.checkout
    return {
        "schema": SCHEMA,
        "generated_at": now.astimezone(timezone.utc).isoformat().replace("+00:00", "Z"),
        "generated_by": f"ops:{by}",
        "order": {k: c.get(k) for k in ORDER_FIELDS},
        "payments": [{k: v for k, v in p.items() if k not in ("lease_owner", "lease_until")} for p in s.payments],
        "refunds": refunds,
        "payment_timeline": [{k: e[k] for k in ("created_at", "source", "from_status", "to_status", "note", "trace_id")}
                             for e in s.timeline],
        "psp_webhooks": s.psp_events,
        "trace_ids": s.trace_ids,
        "codes": codes,  # the code pool's part (code orders), else null
    }


async def _codepool_part(order_id: str, by: str) -> dict:
    import grpc  # noqa: F401 (errors surface as grpc.aio.AioRpcError)

    from cuty.codepool.v1 import codepool_pb2, codepool_pb2_grpc
    from cutylib.config import grpc_addr_for
    from cutylib.grpc_client import create_channel
    from cutylib.tls import CODEPOOL, PAYMENTS, Transport

    async with create_channel(grpc_addr_for("codepool"), CODEPOOL, Transport.from_env(PAYMENTS),
                              deadline_seconds=30) as ch:
        answer = await codepool_pb2_grpc.CodePoolServiceStub(ch).GetOrderEvidence(
            codepool_pb2.GetOrderEvidenceRequest(order_id=order_id, requested_by=by))
    return json.loads(answer.document_json)


async def evidence(pool, query: str, *, by: str, codepool=_codepool_part) -> list[dict[str, Any]]:
    """One document per order `query` names (payments without a checkout are not orders)."""
    from .ops.queries import _plain

    out = []
    for s in await story(pool, query):
        if s.checkout is None:
            continue
        ids = [p["id"] for p in s.payments]
        refunds = [_plain(r) for r in await pool.fetch(REFUNDS, ids)] if ids else []
        codes = await codepool(s.checkout["order_id"], by) if s.checkout["kind"] == "codes" else None
        await pool.execute(AUDIT_OPERATOR_READ, f"ops:{by}", "chargeback evidence", s.checkout["id"],
                           s.checkout.get("merchant_id"), "")
        out.append(document(s, refunds, codes, by=by, now=datetime.now(timezone.utc)))
    return out


async def _run(args) -> int:
    import grpc

    from .ops.cli import _connect, _dump

    pool = await _connect()
    found = 0
    try:
        for query in args.ids:
            try:
                docs = await evidence(pool, query, by=args.by)
            except grpc.aio.AioRpcError as e:
                print(f"{query}: the code pool answered {e.code().name}: {e.details()}", file=sys.stderr)
                return 1
            if not docs:
                print(f"{query}: no order found (tried: checkout id, payment id, PSP intent id, payment attempt id, "
                      "checkout Idempotency-Key)", file=sys.stderr)
            for d in docs:
                found += 1
                if args.out:
                    path = pathlib.Path(args.out) / f"{d['order']['id']}.json"
                    path.write_text(_dump(d) + "\n")
                    print(path)
                else:
                    print(json.dumps(d, separators=(",", ":")))
    finally:
        await pool.close()
    return 0 if found else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m payments evidence", description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="+", help="checkout id (= order id), payment id, PSP intent id, payment attempt "
                                               "id or a checkout Idempotency-Key; several for several orders")
    parser.add_argument("--by", required=True, help="who exports (recorded by payments and the code pool)")
    parser.add_argument("--out", help="a folder: one <checkout id>.json per order (default: JSON lines on stdout)")
    args = parser.parse_args(argv)
    args.by = args.by.strip()
    if not 1 <= len(args.by) <= 100:
        parser.error("--by must name who exports (1-100 characters)")
    if len(args.ids) > 100:
        parser.error(f"at most 100 ids at a time, got {len(args.ids)}")
    if args.out and not pathlib.Path(args.out).is_dir():
        parser.error(f"--out {args.out}: no such folder")
    try:
        return asyncio.run(_run(args))
    except (OSError, asyncpg.PostgresError) as e:
        print(f"cannot reach the payments database: {e}", file=sys.stderr)
        return 1
