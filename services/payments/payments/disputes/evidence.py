"""Evidence for a dispute, assembled from the facts the platform holds and submitted to the PSP
before its deadline (docs/payments.md, "Disputes").

- codes: the code pool's facts of the order (GetOrderFacts): when each code was delivered (and
  revoked, replaced after a claim), every plaintext read of them by the buyer with its time, the
  claims;
- bookings: the checkout's own facts: when the booking was confirmed (its COMPLETED transition in
  the timeline), the slot and its start, the cancellation policy accepted at purchase.

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
import logging
import uuid
from typing import Any

import grpc

from cuty.codepool.v1 import claims_pb2 as cpb
from cutylib import principal
from cutylib.config import env_float
from cutylib.periodic import TRANSIENT, periodic
from cutylib.telemetry import quiet
from cutylib.timestamps import from_timestamp

from ..checkout import crash
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
    INSERT INTO payment_events (payment_id, checkout_id, source, from_status, to_status, note)
    SELECT d.payment_id, d.checkout_id, 'dispute', 'dispute.needs_response', 'dispute.' || d.status,
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


def _iso(value) -> str | None:
    if value is None:
        return None
    if hasattr(value, "seconds"):  # a protobuf Timestamp
        if not value.seconds and not value.nanos:
            return None
        value = from_timestamp(value)
    return value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def booking_evidence(c) -> dict[str, Any]:
    return {"booking": {
        "checkout_id": str(c["id"]), "slot_id": str(c["slot_id"] or ""), "salon_id": str(c["salon_id"] or ""),
        "start_time": _iso(c["start_time"]), "purchased_at": _iso(c["created_at"]), "confirmed_at": _iso(c["confirmed_at"]),
        "cancellation_policy_accepted": {"free_cancellation_hours": c["free_cancellation_hours"],
                                         "cancellation_fee_percent": c["cancellation_fee_percent"]}}}


def codes_evidence(c, facts: cpb.OrderFacts) -> dict[str, Any]:
    return {"codes": {
        "checkout_id": str(c["id"]), "product_id": facts.product_id, "quantity": facts.quantity,
        "purchased_at": _iso(c["created_at"]), "delivered_at": _iso(facts.deliver_time),
        "deliveries": [{"code_id": x.code_id, "status": x.status, "delivered_at": _iso(x.deliver_time),
                        "revoked_at": _iso(x.revoke_time)} for x in facts.codes],
        "plaintext_reads": [{"at": _iso(r.read_time), "by": r.actor, "code_ids": list(r.code_ids)} for r in facts.reads],
        "claims": [{"id": k.id, "code_id": k.code_id, "status": cpb.ClaimStatus.Name(k.status), "reason": k.reason,
                    "opened_at": _iso(k.open_time)} for k in facts.claims]}}


class EvidenceWorker:
    def __init__(self, pool, psp, claims_stub, worker_id: str, *, lease_seconds: float = 30.0,
                 poll_seconds: float | None = None, batch: int = 10, inbox=None, recheck_seconds: float | None = None):
        self.pool = pool
        self.inbox = inbox  # the DisputeInbox: the PSP's answer that a dispute closed is recorded as its webhook would be
        self.recheck_seconds = recheck_seconds if recheck_seconds is not None else env_float(
            "CUTY_DISPUTE_RECHECK_SECONDS", 60.0)
        self.psp = psp
        self.stub = claims_stub
        self.worker_id = f"disputes:{worker_id}"
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds if poll_seconds is not None else env_float(
            "CUTY_DISPUTE_EVIDENCE_POLL_SECONDS", 5.0)
        self.batch = batch

    async def assemble(self, d) -> dict[str, Any]:
        c = await self.pool.fetchrow(CHECKOUT, d["checkout_id"]) if d["checkout_id"] else None
        out: dict[str, Any] = {"payment_id": str(d["payment_id"]), "dispute": d["psp_dispute_id"],
                               "customer_id": c["customer_id"] if c else None}
        if c is None:
            return out
        if c["kind"] == "booking":
            out.update(booking_evidence(c))
        else:
            with principal.acting_as(principal.SYSTEM):
                facts = await self.stub.GetOrderFacts(cpb.GetOrderFactsRequest(order_id=str(c["id"])))
            out.update(codes_evidence(c, facts))
        return out

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


