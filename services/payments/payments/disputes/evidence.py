"""Evidence for a dispute, assembled from the facts the platform holds and submitted to the PSP
before its deadline (docs/payments.md, "Disputes").

The document is the chargeback evidence of `payments/evidence.py` (schema cuty.chargeback-evidence/1,
the one an operator exports with `python -m payments evidence`): the order, its payments, refunds,
PSP webhooks and timeline, and for codes the code pool's part (GetOrderEvidence: each code masked
with its deliveries, every plaintext read by the buyer with its time, the order's audit trail:
claims and replacements too). For a booking it adds what the buyer accepted: the slot and its
start, when it was confirmed (its COMPLETED transition) and the cancellation policy at purchase.

A worker of every replica claims open disputes without evidence, nearest deadline first, with
`FOR UPDATE SKIP LOCKED` and a lease (one replica works on a dispute at a time; a dead one's lease
runs out), asks the PSP to take the evidence (the same evidence again is answered as a retry), and
records it with its timeline event in one statement that only writes while no evidence is recorded.
A crash between the PSP's answer and the record is found again and re-submitted; a PSP that no
longer takes evidence (submitted already, closed, too late) is asked what it holds instead.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from typing import Any

import grpc

from cuty.codepool.v1 import codepool_pb2
from cutylib import principal
from cutylib.config import env_float
from cutylib.periodic import TRANSIENT, periodic
from cutylib.telemetry import quiet

from cutylib import crash
from ..evidence import evidence
from ..psp import PspError, PspUnavailable

log = logging.getLogger("payments.disputes.evidence")

CLAIM = """
UPDATE disputes d SET lease_owner = $1, lease_until = clock_timestamp() + make_interval(secs => $2),
                      attempts = d.attempts + 1, updated_at = clock_timestamp()
FROM (SELECT merchant_id, id FROM disputes
      WHERE status = 'needs_response' AND evidence_submitted_at IS NULL AND evidence_due_by > clock_timestamp()
        AND (lease_until IS NULL OR lease_until < clock_timestamp())
      ORDER BY evidence_due_by LIMIT $3 FOR UPDATE SKIP LOCKED) due
WHERE d.merchant_id = due.merchant_id AND d.id = due.id
RETURNING d.*
"""

CHECKOUT = """
SELECT c.id, c.kind, c.customer_id, c.amount_minor, c.currency, c.slot_id, c.salon_id, c.product_id, c.quantity,
       c.start_time, c.free_cancellation_hours, c.cancellation_fee_percent, c.created_at,
       (SELECT e.created_at FROM payment_events e WHERE e.checkout_id = c.id AND e.to_status = 'COMPLETED'
        ORDER BY e.seq LIMIT 1) AS confirmed_at
FROM checkouts c WHERE c.id = $1
"""

# The evidence and its timeline event, once: only while no evidence is recorded for the dispute.
RECORD = """
WITH d AS (
    UPDATE disputes SET evidence = $3::jsonb, evidence_submitted_at = clock_timestamp(), lease_owner = NULL,
                        lease_until = NULL, last_error = '', updated_at = clock_timestamp(),
                        status = CASE WHEN status = 'needs_response' AND $4::text = 'under_review'
                                      THEN 'under_review' ELSE status END
    WHERE merchant_id = $1 AND id = $2 AND evidence IS NULL
    RETURNING *
), e AS (
    INSERT INTO payment_events (payment_id, checkout_id, merchant_id, source, from_status, to_status, note)
    SELECT d.payment_id, d.checkout_id, d.merchant_id, 'dispute', 'dispute.needs_response', 'dispute.' || d.status,
           'evidence submitted for ' || d.psp_dispute_id || ': ' || $5::text
    FROM d
)
SELECT count(*) FROM d
"""

# Disputes whose evidence is recorded but whose outcome has not come (a lost or late webhook) for
# $3 seconds: asked of the PSP, like reconciliation asks about payments. Claimed like CLAIM.
RECHECK = """
UPDATE disputes d SET lease_owner = $1, lease_until = clock_timestamp() + make_interval(secs => $2),
                      updated_at = clock_timestamp()
FROM (SELECT merchant_id, id FROM disputes
      WHERE status IN ('needs_response', 'under_review') AND evidence_submitted_at IS NOT NULL
        AND updated_at < clock_timestamp() - make_interval(secs => $3)
        AND (lease_until IS NULL OR lease_until < clock_timestamp())
      ORDER BY updated_at LIMIT $4 FOR UPDATE SKIP LOCKED) due
WHERE d.merchant_id = due.merchant_id AND d.id = due.id
RETURNING d.*
"""

GIVE_BACK = """
UPDATE disputes SET lease_owner = NULL, lease_until = NULL, last_error = $3, updated_at = clock_timestamp()
WHERE merchant_id = $1 AND id = $2 AND lease_owner = $4
"""


# What the PSP takes as one submission (the simulator refuses more); a larger document leaves out
# the parts a bank reads last, in this order.
MAX_EVIDENCE_BYTES = 60 * 1024
TRIMMABLE = ("psp_webhooks", "payment_timeline", "trace_ids")


def _iso(value) -> str | None:
    return None if value is None else value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def bounded(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` within MAX_EVIDENCE_BYTES: the trimmable parts left out, one by one, while it is larger."""
    for part in TRIMMABLE:
        if len(json.dumps(doc, separators=(",", ":"), default=str)) <= MAX_EVIDENCE_BYTES:
            break
        doc = {**doc, part: "left out (size)"}
    return doc


def booking_evidence(c) -> dict[str, Any]:
    return {"booking": {
        "checkout_id": str(c["id"]), "slot_id": str(c["slot_id"] or ""), "salon_id": str(c["salon_id"] or ""),
        "start_time": _iso(c["start_time"]), "purchased_at": _iso(c["created_at"]), "confirmed_at": _iso(c["confirmed_at"]),
        "cancellation_policy_accepted": {"free_cancellation_hours": c["free_cancellation_hours"],
                                         "cancellation_fee_percent": c["cancellation_fee_percent"]}}}


class EvidenceWorker:
    def __init__(self, pool, psp, codepool_stub, worker_id: str, *, lease_seconds: float = 30.0,
                 poll_seconds: float | None = None, batch: int = 10, inbox=None, recheck_seconds: float | None = None):
        self.pool = pool
        self.inbox = inbox  # the DisputeInbox: the PSP's answer that a dispute closed is recorded as its webhook would be
        self.recheck_seconds = recheck_seconds if recheck_seconds is not None else env_float(
            "CUTY_DISPUTE_RECHECK_SECONDS", 60.0)
        self.psp = psp
        self.stub = codepool_stub
        self.worker_id = f"disputes:{worker_id}"
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds if poll_seconds is not None else env_float(
            "CUTY_DISPUTE_EVIDENCE_POLL_SECONDS", 5.0)
        self.batch = batch

    async def _codepool_part(self, order_id: str, by: str) -> dict:
        with principal.acting_as(principal.SYSTEM):
            answer = await self.stub.GetOrderEvidence(codepool_pb2.GetOrderEvidenceRequest(order_id=order_id,
                                                                                           requested_by=by))
        return json.loads(answer.document_json)

    async def assemble(self, d) -> dict[str, Any]:
        query = str(d["checkout_id"] or d["payment_id"])
        docs = await evidence(self.pool, query, by="disputes", codepool=self._codepool_part)
        out: dict[str, Any] = {"dispute": d["psp_dispute_id"], "payment_id": str(d["payment_id"])}
        if docs:
            out.update(docs[0])
            out.pop("generated_at", None)  # the same facts make the same evidence (a retry is one submission)
        if d["checkout_id"]:
            c = await self.pool.fetchrow(CHECKOUT, d["checkout_id"])
            if c is not None and c["kind"] == "booking":
                out.update(booking_evidence(c))
        return bounded(json.loads(json.dumps(out, default=str)))

    async def submit_one(self, d) -> bool:
        """Assemble, submit and record one claimed dispute's evidence; whether it was recorded."""
        evidence = await self.assemble(d)
        crash.point("dispute_evidence:before")
        try:
            answer = await self.psp.submit_dispute_evidence(d["psp_dispute_id"], evidence)
        except PspError as e:
            if e.code not in ("dispute_not_open", "evidence_too_late"):
                raise
            answer = await self.psp.get_dispute(d["psp_dispute_id"])  # what the PSP holds, if anything
            if not answer.get("evidence"):
                await self.pool.execute(GIVE_BACK, d["merchant_id"], d["id"], f"PSP: {e.code}", self.worker_id)
                return False
            evidence = answer["evidence"]
        crash.point("dispute_evidence:after")
        summary = ", ".join(sorted(k for k in evidence if k not in ("payment_id", "dispute", "customer_id")))
        n = await self.pool.fetchval(RECORD, d["merchant_id"], d["id"], evidence, answer.get("status", ""),
                                     summary or "payment facts")
        log.info("dispute evidence submitted", extra={"dispute_id": str(d["id"]), "psp_dispute_id": d["psp_dispute_id"],
                                                      "recorded": bool(n)})
        await self._closed_already(answer)
        return bool(n)

    async def _closed_already(self, answer: dict[str, Any]) -> None:
        """The PSP says the dispute is closed: record it as its charge.dispute.closed webhook would be
        (one event id per outcome, so the webhook itself, arriving later, changes nothing)."""
        if self.inbox is not None and answer.get("status") in ("won", "lost") and answer.get("id"):
            await self.inbox.record({"id": f"evt_asked_{answer['id']}_{answer['status']}", "type": "charge.dispute.closed",
                                     "data": {"object": answer}})

    async def recheck_once(self) -> int:
        with quiet():
            rows = await self.pool.fetch(RECHECK, self.worker_id, float(self.lease_seconds), float(self.recheck_seconds),
                                         self.batch)
        for d in rows:
            try:
                await self._closed_already(await self.psp.get_dispute(d["psp_dispute_id"]))
            except (PspUnavailable, PspError) as e:
                log.warning("dispute not rechecked", extra={"dispute_id": str(d["id"]), "error": str(e)[:300]})
            await self.pool.execute(GIVE_BACK, d["merchant_id"], d["id"], "", self.worker_id)
        return len(rows)

    async def run_once(self) -> int:
        await self.recheck_once()
        with quiet():
            rows = await self.pool.fetch(CLAIM, self.worker_id, float(self.lease_seconds), self.batch)
        done = 0
        for d in rows:
            try:
                done += await self.submit_one(d)
            except (PspUnavailable, PspError, grpc.aio.AioRpcError, asyncio.TimeoutError) as e:
                log.warning("dispute evidence not submitted; retried when its lease runs out",
                            extra={"dispute_id": str(d["id"]), "error": str(e)[:300]})
                await self.pool.execute(GIVE_BACK, d["merchant_id"], d["id"], str(e)[:500], self.worker_id)
        return done

    async def run(self) -> None:
        await periodic(self.run_once, self.poll_seconds, what="dispute evidence", log=log,
                       retry_on=(*TRANSIENT, grpc.aio.AioRpcError))


