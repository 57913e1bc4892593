"""How disputes plug into the payments server (payments/bootstrap.py calls `register`)."""
from __future__ import annotations

from .evidence import EvidenceWorker
from .inbox import DisputeInbox


def register(server, pool, core, inbox, claims_stub, *, workers: bool = True) -> DisputeInbox:
    """`inbox`: the WebhookInbox, which hands charge.dispute.* events to the DisputeInbox;
    `claims_stub`: the code pool's CodeClaimService (an order's facts, for the evidence)."""
    disputes = DisputeInbox(pool, core.metrics)
    inbox.disputes = disputes
    if workers:
        worker = EvidenceWorker(pool, core.psp, claims_stub, core.worker_id,
                                lease_seconds=float(core.settings.lease_seconds), inbox=disputes)
        server.add_background(worker.run)
    return disputes
