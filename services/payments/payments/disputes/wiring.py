"""How disputes plug into the payments server (payments/bootstrap.py calls `register`)."""
from __future__ import annotations

from cuty.codepool.v1 import codepool_pb2_grpc
from cutylib.config import grpc_addr_for
from cutylib.grpc_client import create_channel
from cutylib.tls import CODEPOOL

from .evidence import EvidenceWorker
from .inbox import DisputeInbox
from .poller import DisputePoller


def register(server, pool, core, inbox, *, workers: bool = True, codepool_stub=None) -> DisputeInbox:
    """`inbox`: the WebhookInbox, which hands charge.dispute.* events to the DisputeInbox, as the
    poller does with the disputes the PSP lists (a webhook lost); the evidence worker asks the code pool for its part of an order's evidence (GetOrderEvidence)."""
    disputes = DisputeInbox(pool, core.metrics)
    inbox.disputes = disputes
    if workers:
        if codepool_stub is None:
            channel = create_channel(grpc_addr_for("codepool"), CODEPOOL, server.transport, deadline_seconds=30.0)
            server.on_stop(channel.close)
            codepool_stub = codepool_pb2_grpc.CodePoolServiceStub(channel)
        worker = EvidenceWorker(pool, core.psp, codepool_stub, core.worker_id,
                                lease_seconds=float(core.settings.lease_seconds), inbox=disputes)
        server.add_background(worker.run)
        # What a lost webhook did not bring, asked of the PSP's list API (the same recording path).
        server.add_background(DisputePoller(pool, core.psp, disputes, worker_id=core.worker_id).run)
    return disputes
