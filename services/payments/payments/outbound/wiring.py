"""How outbound events plug into the payments server (payments/bootstrap.py calls `register`)."""
from __future__ import annotations

from cuty.codepool.v1 import codepool_pb2_grpc
from cuty.payments.v1 import webhooks_pb2, webhooks_pb2_grpc
from cutylib.config import grpc_addr_for
from cutylib.grpc_client import create_channel
from cutylib.metrics import refresh_periodically
from cutylib.tls import CODEPOOL

from .grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES, WebhookEndpointApi
from .metrics import process_metrics
from .relay import StockEventRelay
from .secrets import SecretBox
from .repository import Deliveries, Endpoints
from .service import WebhookEndpoints
from .worker import DeliveryOptions, DeliveryWorker

SERVICE = webhooks_pb2.DESCRIPTOR.services_by_name["WebhookEndpointService"]


def delivery_worker_id(worker_id: str, i: int) -> str:
    return f"webhooks:{worker_id}" + (f":{i}" if i else "")


def refresh_delivery_gauges(add_background, pool, box: SecretBox) -> None:
    """The delivery gauges (backlog, oldest due, open circuits), where delivery workers run."""
    metrics, deliveries = process_metrics(), Deliveries(pool, box)
    add_background(lambda: refresh_periodically(lambda: metrics.refresh(deliveries)))


def register(server, settings, pool, worker_id: str, *, workers: bool = True) -> None:
    box = SecretBox.load(settings.webhook_secret_keys, settings.data_dir)
    # Endpoint secrets stored in plaintext, if any, are sealed before this replica serves.
    server.on_database_ready(lambda: box.encrypt_stored(pool))
    service = WebhookEndpoints(Endpoints(pool, box), settings.environment)
    webhooks_pb2_grpc.add_WebhookEndpointServiceServicer_to_server(WebhookEndpointApi(service), server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    if workers:
        options = DeliveryOptions()
        # None (CUTY_WEBHOOKS_OUT_WORKERS=0) where a process of their own delivers (process.py).
        for i in range(options.workers):
            server.add_background(DeliveryWorker(pool, delivery_worker_id(worker_id, i), options, box=box).run)
        if options.workers:
            refresh_delivery_gauges(server.add_background, pool, box)
        # `stock.low` comes from the code pool's outbox (relay.py).
        channel = create_channel(grpc_addr_for("codepool"), CODEPOOL, server.transport, deadline_seconds=10.0)
        relay = StockEventRelay(pool, codepool_pb2_grpc.CodePoolServiceStub(channel))
        server.add_background(relay.run)
        server.on_stop(channel.close)
