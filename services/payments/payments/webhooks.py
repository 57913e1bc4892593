"""PSP webhooks: verify, store (deduplicated on the PSP's event id) before acknowledging, then
finalize under the payment's lease; if another worker holds it, keep the event deferred and let the
retry worker finish it (docs/payments.md, "Webhooks")."""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from typing import Any

import asyncpg
from opentelemetry import trace

from cutylib.errors import InvalidArgument, Unauthenticated
from cutylib.metrics import observe
from cutylib.telemetry import link_to, quiet, set_span_attributes

from . import domain, signature
from .service import PaymentsCore

log = logging.getLogger(__name__)
tracer = trace.get_tracer("cuty.payments.webhooks")

# Find the payment and store the event (deduplicated on its id) in one statement. An event that
# only repeats what the payment already says, or says less (same intent, and a status `finalize`
# would decide SAME or STALE for: $9, domain.old_news, e.g. a late `processing`, or the usual
# `succeeded` after the synchronous answer captured the payment), is stored `processed` at once:
# the status only moves forward, so the event can never change anything later either, and it needs
# no lease, read or write; no payment row is touched, so no checkout saga is woken.
# $7: the status the event reports (NULL: a type we do not act on -> ignored).
RESOLVE_AND_STORE = """
WITH p AS (
    SELECT id, status, psp_intent_id, checkout_id FROM payments
    WHERE id = $1 OR psp_intent_id = $2 OR idempotency_key = $3
    ORDER BY (id = $1) DESC NULLS LAST LIMIT 1
), ins AS (
    -- Stored unless its id is (psp_events_store: one row per event id across the partitions).
    SELECT s.status, p.id AS payment_id
    FROM (SELECT 1) one
    LEFT JOIN p ON true
    CROSS JOIN LATERAL (SELECT CASE
        WHEN p.id IS NULL OR $7::text IS NULL THEN 'ignored'
        WHEN p.status = ANY($9::text[]) AND p.psp_intent_id = $2 THEN 'processed'
        ELSE 'received' END AS status) s
    WHERE psp_events_store($4::text, $5::text, p.id, $6::jsonb, s.status, $8::float8)
)
-- The checkout's traceparent: the handling links to the trace of the purchase it belongs to.
SELECT status, payment_id, (SELECT c.traceparent FROM checkouts c, p WHERE c.id = p.checkout_id) AS traceparent
FROM ins
"""

# What became of an event, and when a deferred or retried one is due again.
MARK_PSP_EVENT = """
UPDATE psp_events SET
    status = $2,
    processed_at = CASE WHEN $2 IN ('processed', 'ignored') THEN clock_timestamp() END,
    next_attempt_at = CASE WHEN $2 IN ('deferred', 'received')
                           THEN clock_timestamp() + make_interval(secs => $3::float8) END,
    last_error = $4
WHERE event_id = $1 AND status IN ('received', 'deferred')
"""

# Claiming pushes next_attempt_at forward: the row is invisible to other replicas until then.
CLAIM_PSP_EVENTS = """
WITH due AS (
    SELECT event_id FROM psp_events
    WHERE status IN ('received', 'deferred') AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE psp_events e SET attempts = e.attempts + 1,
    next_attempt_at = clock_timestamp() + make_interval(secs => $2::float8)
FROM due
WHERE e.event_id = due.event_id
RETURNING e.event_id, e.type, e.payment_id, e.payload, e.attempts
"""

# An event that keeps failing (not one waiting for a lease) is given up after this many attempts:
# reconciliation still asks the PSP about its payment, so no money is stranded by giving up.
MAX_FAILED_ATTEMPTS = 20


def _shown(value: Any, limit: int = 40) -> str:
    """A bad value as an error message shows it: its repr, cut short. A value of thousands of
    characters in a message overflowed gRPC's metadata limit (found by the webhook property test)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_event(payload: bytes) -> dict[str, Any]:
    """The event of a well-signed body, or InvalidArgument (nothing is stored for it)."""
    try:
        event = json.loads(payload)
        # Stored as jsonb, and its strings as text: no NUL, no lone surrogate, no NaN / Infinity
        # (1e999 parses as inf), none of which Postgres takes.
        text = json.dumps(event, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except RecursionError:  # nested deeper than the parser goes
        raise InvalidArgument("payload", "webhook body is nested too deeply") from None
    except ValueError:  # not JSON, not UTF-8, an integer of thousands of digits, NaN / Infinity
        raise InvalidArgument("payload", "webhook body must be a JSON object in UTF-8") from None
    if "\\u0000" in text:  # json.dumps escapes NUL (a literal "\\u0000" in a string is refused too)
        raise InvalidArgument("payload", "webhook body must not contain NUL characters")
    if not isinstance(event, dict):
        raise InvalidArgument("payload", f"webhook body must be a JSON object, got {type(event).__name__}")
    if not isinstance(event.get("id"), str) or not event["id"] or len(event["id"]) > 255:
        raise InvalidArgument("payload.id", f"webhook event id must be a non-empty string, got {_shown(event.get('id'))}")
    if not isinstance(event.get("type"), str):
        raise InvalidArgument("payload.type", f"webhook event type must be a string, got {_shown(event.get('type'))}")
    data = event.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("object"), dict):
        raise InvalidArgument("payload.data.object", "webhook event must carry data.object")
    obj = data["object"]
    # The object must say which intent it is about: finalize refuses an object of another intent
    # than the payment's, and an object naming none would slip past that check.
    intent_field = "payment_intent" if obj.get("object") in ("refund", "dispute") else "id"
    if not isinstance(obj.get(intent_field), str) or not obj[intent_field]:
        raise InvalidArgument(f"payload.data.object.{intent_field}",
                              f"webhook object must name its payment intent, got {_shown(obj.get(intent_field))}")
    return event


# What a payment intent carries that lets someone act for the customer (complete 3-D Secure, confirm
# the intent client-side). Kept out of psp_events: the payments row keeps what
# the customer still needs, and only while it needs it (invariant 6).
SECRET_FIELDS = ("client_secret", "next_action")


def without_secrets(event: dict[str, Any]) -> dict[str, Any]:
    """The event as stored: its object without SECRET_FIELDS (the caller's dict is not changed)."""
    obj = {k: v for k, v in event["data"]["object"].items() if k not in SECRET_FIELDS}
    return {**event, "data": {**event["data"], "object": obj}}


def _as_uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


class WebhookInbox:
    def __init__(self, core: PaymentsCore, secrets: list[str]):
        self.core = core
        self.secrets = secrets
        self.pool = core.pool
        self.metrics = core.metrics
        self.options = core.options
        # Disputes are recorded by their own path (payments/disputes/inbox.py), set by the wiring.
        self.disputes = None

    async def handle(self, payload: bytes, signature_header: str | None) -> str:
        """One delivery -> stored | duplicate | ignored | deferred | processed (all acknowledged)."""
        try:
            signature.verify(signature_header, payload, self.secrets, tolerance=self.options.webhook_tolerance_seconds)
        except Unauthenticated as exc:
            # A timestamp outside the tolerance is a replay (or a clock off); anything else a forgery.
            self.metrics.webhooks.labels("", "stale" if exc.reason in ("signature-stale", "signature-future")
                                         else "bad_signature").inc()
            log.warning("webhook refused", extra={"reason": exc.reason})
            raise
        event = parse_event(payload)
        if self.disputes is not None and event["type"].startswith("charge.dispute."):
            outcome = await self.disputes.record(event)
            self.metrics.webhooks.labels(event["type"], "duplicate" if outcome == "duplicate" else "accepted").inc()
            return outcome
        obj = event["data"]["object"]
        observed = domain.EVENT_STATUS.get(event["type"])
        stored = await self._resolve_and_store(event, obj, observed)
        kind = event["type"] if isinstance(event.get("type"), str) else ""
        if stored is None:
            self.metrics.webhooks.labels(kind, "duplicate").inc()
            return "duplicate"
        status, payment_id = stored["status"], stored["payment_id"]
        self.metrics.webhooks.labels(kind, "ignored" if status == "ignored" else "accepted").inc()
        if status == "ignored":
            log.info("webhook ignored", extra={"event_id": event["id"], "event_type": event["type"],
                                               "known_payment": payment_id is not None})
            return "ignored"
        if status == "processed":  # old news to the payment (its status or an earlier one): nothing to do
            set_span_attributes(payment_id=str(payment_id))
            return "processed"
        # Stored: from here on the delivery is acknowledged whatever happens; a failure below leaves
        # the event 'received' for the retry worker.
        # A real PSP sends no traceparent, so the handling is linked to the checkout's trace.
        with tracer.start_as_current_span("payments.webhook", links=link_to(stored["traceparent"]), attributes={
                "cuty.payment.id": str(payment_id), "cuty.psp.event.type": event["type"]}):
            return await self.process(event["id"], event["type"], payment_id, obj, attempts=0,
                                      created=event.get("created"))

    async def _resolve_and_store(self, event: dict[str, Any], obj: dict[str, Any], observed: str | None):
        """The stored row's (status, payment_id), or None for a duplicate delivery."""
        metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        intent_id = obj.get("payment_intent") if obj.get("object") == "refund" else obj.get("id")
        request = event.get("request") if isinstance(event.get("request"), dict) else {}
        key = request.get("idempotency_key") if obj.get("object") != "refund" else None
        return await self.pool.fetchrow(RESOLVE_AND_STORE, _as_uuid(metadata.get("payment_id")),
                                        intent_id if isinstance(intent_id, str) else None,
                                        key if isinstance(key, str) else None,
                                        event["id"], event["type"], without_secrets(event), observed,
                                        float(self.options.event_retry_seconds),
                                        domain.old_news(observed) if observed else ())

    async def process(self, event_id: str, event_type: str, payment_id: uuid.UUID, obj: dict[str, Any],
                      attempts: int, created: Any = None) -> str:
        set_span_attributes(payment_id=str(payment_id))
        observed = domain.EVENT_STATUS[event_type]
        try:
            if event_type == "charge.refunded" and isinstance(obj.get("payment_intent"), str):
                # A refund may be partial, and only the intent's totals say whether the whole
                # charge went back (refunded) or not (succeeded: old news for a partly refunded payment,
                # whose own refund path records it). Asking is idempotent; a failure retries below.
                obj = await self.core.psp.get_intent(obj["payment_intent"])
                observed = domain.status_of_intent(obj)
            view = await self.core.finalize_leased(str(payment_id), observed, "webhook", intent=obj,
                                                   note=f"{event_type} {event_id}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - stored; the retry worker tries again
            error = f"{type(exc).__name__}: {exc}"
            if attempts >= MAX_FAILED_ATTEMPTS:
                log.error("webhook given up; reconciliation covers its payment", exc_info=True,
                          extra={"event_id": event_id, "payment_id": str(payment_id), "attempts": attempts})
                await self._mark(event_id, "ignored", 0.0, error)
                return "ignored"
            log.warning("webhook processing failed; will retry", exc_info=True,
                        extra={"event_id": event_id, "payment_id": str(payment_id)})
            await self._mark(event_id, "received", self._backoff(attempts + 1), error)
            return "stored"
        if view is None:
            log.info("payment lease held elsewhere; webhook deferred",
                     extra={"event_id": event_id, "payment_id": str(payment_id), "attempts": attempts})
            await self._mark(event_id, "deferred", self._backoff(attempts), "lease held by another worker")
            return "deferred"
        await self._mark(event_id, "processed", 0.0, "")
        if isinstance(created, (int, float)):  # the PSP's event time, whole seconds
            observe(self.metrics.webhook_lag, max(0.0, time.time() - created))
        return "processed"

    def _backoff(self, attempts: int) -> float:
        # Leases are short-lived (one finalize), so retry soon; never later than one lease period.
        cap = float(self.core.settings.lease_seconds)
        return min(cap, 0.1 * 2 ** min(attempts, 10)) * random.uniform(0.5, 1.0)

    async def _mark(self, event_id: str, status: str, delay: float, error: str) -> None:
        await self.pool.execute(MARK_PSP_EVENT, event_id, status, delay, error)

    async def run_retries(self) -> None:
        """Worker: finish deferred events and events whose inline handling died."""
        while True:
            with quiet():  # polling starts no trace
                rows = await self.pool.fetch(CLAIM_PSP_EVENTS, self.options.batch_size,
                                             float(self.options.event_retry_seconds))
            for r in rows:
                payload = r["payload"]
                await self.process(r["event_id"], r["type"], r["payment_id"], payload["data"]["object"],
                                   attempts=r["attempts"], created=payload.get("created"))
            if not rows:
                await asyncio.sleep(self.options.poll_seconds)
