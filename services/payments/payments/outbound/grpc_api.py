"""cuty.payments.v1.WebhookEndpointService: proto <-> use case translation only."""
from __future__ import annotations

from datetime import datetime

import grpc

from cuty.payments.v1 import webhooks_pb2 as pb
from cuty.payments.v1 import webhooks_pb2_grpc
from cutylib import principal
from cutylib.timestamps import to_timestamp
from cutylib.tls import GATEWAY

from .repository import Delivery, Endpoint
from .service import WebhookEndpoints

# Which service may call each RPC (its certificate's identity): the merchants' admins, through the gateway.
CALLERS = {"CreateWebhookEndpoint": {GATEWAY}, "ListWebhookEndpoints": {GATEWAY},
           "DeleteWebhookEndpoint": {GATEWAY}, "ListWebhookDeliveries": {GATEWAY},
           "RedeliverWebhook": {GATEWAY}}
SYSTEM_RPCS: frozenset[str] = frozenset()  # no service calls these as itself
USER_ROLES = frozenset({"admin"})  # the gateway brings merchants' admins only


def endpoint_proto(e: Endpoint) -> pb.WebhookEndpoint:
    return pb.WebhookEndpoint(id=e.id, merchant_id=e.merchant_id, url=e.url, events=e.events, secret=e.secret,
                              create_time=to_timestamp(e.created_at))


def delivery_proto(d: Delivery) -> pb.WebhookDelivery:
    out = pb.WebhookDelivery(id=d.id, endpoint_id=d.endpoint_id, event_id=d.event_id, event_type=d.event_type,
                             state=d.state, attempts=d.attempts, create_time=to_timestamp(d.created_at))
    if d.next_attempt_at is not None:
        out.next_attempt_time.CopyFrom(to_timestamp(d.next_attempt_at))
    if d.delivered_at is not None:
        out.deliver_time.CopyFrom(to_timestamp(d.delivered_at))
    for a in d.attempt_log:
        out.attempt_log.add(attempt=a["attempt"], start_time=to_timestamp(datetime.fromisoformat(a["started_at"])),
                            http_status=a["http_status"], error=a["error"], duration_ms=a["duration_ms"])
    return out


class WebhookEndpointApi(webhooks_pb2_grpc.WebhookEndpointServiceServicer):
    def __init__(self, service: WebhookEndpoints):
        self.service = service

    async def CreateWebhookEndpoint(self, request: pb.CreateWebhookEndpointRequest,
                                    context: grpc.aio.ServicerContext) -> pb.WebhookEndpoint:
        return endpoint_proto(await self.service.create(principal.current(), request.url, list(request.events)))

    async def ListWebhookEndpoints(self, request: pb.ListWebhookEndpointsRequest,
                                   context: grpc.aio.ServicerContext) -> pb.ListWebhookEndpointsResponse:
        return pb.ListWebhookEndpointsResponse(
            endpoints=[endpoint_proto(e) for e in await self.service.list(principal.current())])

    async def DeleteWebhookEndpoint(self, request: pb.DeleteWebhookEndpointRequest,
                                    context: grpc.aio.ServicerContext) -> pb.DeleteWebhookEndpointResponse:
        await self.service.delete(principal.current(), request.endpoint_id)
        return pb.DeleteWebhookEndpointResponse()

    async def ListWebhookDeliveries(self, request: pb.ListWebhookDeliveriesRequest,
                                    context: grpc.aio.ServicerContext) -> pb.ListWebhookDeliveriesResponse:
        rows, token = await self.service.deliveries(principal.current(), request.endpoint_id, request.page_size,
                                                    request.page_token)
        return pb.ListWebhookDeliveriesResponse(deliveries=[delivery_proto(d) for d in rows], next_page_token=token)

    async def RedeliverWebhook(self, request: pb.RedeliverWebhookRequest,
                               context: grpc.aio.ServicerContext) -> pb.WebhookDelivery:
        return delivery_proto(await self.service.redeliver(principal.current(), request.endpoint_id,
                                                           request.delivery_id))
