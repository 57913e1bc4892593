"""How claim resolution plugs into the payments server (payments/bootstrap.py calls `register`)."""
from __future__ import annotations

import grpc

from cuty.codepool.v1 import claims_pb2_grpc as codepool_claims
from cuty.payments.v1 import claims_pb2, claims_pb2_grpc
from cutylib.config import grpc_addr_for
from cutylib.grpc_client import create_channel
from cutylib.periodic import TRANSIENT, periodic
from cutylib.tls import CODEPOOL

from .grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES, ClaimApi
from .service import ClaimResolver, log

SERVICE = claims_pb2.DESCRIPTOR.services_by_name["ClaimService"]


def register(server, pool, core, *, workers: bool = True, stub=None) -> ClaimResolver:
    if stub is None:
        channel = create_channel(grpc_addr_for("codepool"), CODEPOOL, server.transport, deadline_seconds=10.0)
        server.on_stop(channel.close)
        stub = codepool_claims.CodeClaimServiceStub(channel)
    resolver = ClaimResolver(pool, core, stub)
    claims_pb2_grpc.add_ClaimServiceServicer_to_server(ClaimApi(resolver), server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    if workers:
        server.add_background(lambda: periodic(resolver.finish_pending, resolver.finish_every,
                                               what="claim refund finisher", log=log,
                                               retry_on=(*TRANSIENT, grpc.aio.AioRpcError)))
    return resolver
