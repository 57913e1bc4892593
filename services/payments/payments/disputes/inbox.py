"""A PSP dispute webhook (charge.dispute.created | charge.dispute.closed), recorded by one call of
the database function disputes_record (migrations/functions/disputes_record.sql): stored once,
the dispute moved forward only, its timeline and merchant events written with it. WebhookInbox
hands these events here after verifying the signature and parsing the body."""
from __future__ import annotations

import logging
import uuid
from typing import Any

from cutylib.telemetry import set_span_attributes

from ..webhooks import without_secrets

log = logging.getLogger("payments.disputes")

RECORD = "SELECT * FROM disputes_record($1, $2, $3, $4)"


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


class DisputeInbox:
    def __init__(self, pool, metrics):
        self.pool = pool
        self.disputes = metrics.disputes  # cuty_payments_disputes_total{status}

    async def record(self, event: dict[str, Any]) -> str:
        obj = event["data"]["object"]
        metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        row = await self.pool.fetchrow(RECORD, event["id"], event["type"], without_secrets(event),
                                       _uuid(metadata.get("payment_id")))
        outcome = row["r_outcome"]
        if outcome == "processed" and row["r_changed"]:
            self.disputes.labels(row["r_status"]).inc()
            set_span_attributes(dispute_id=str(row["r_dispute_id"]))
            log.log(logging.WARNING if row["r_status"] == "lost" else logging.INFO, "dispute recorded",
                    extra={"dispute_id": str(row["r_dispute_id"]), "status": row["r_status"], "was": row["r_was"],
                           "psp_dispute_id": obj.get("id")})
        return outcome
