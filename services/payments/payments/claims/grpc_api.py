"""gRPC <-> claim resolution (ClaimService; docs/payments.md, "Code claims"): translate protos,
check who may call, pass the code pool's refusals on unchanged; no business rules here."""
from __future__ import annotations

import grpc

from cuty.codepool.v1 import claims_pb2 as cpb
from cuty.payments.v1 import claims_pb2 as pb, claims_pb2_grpc
from cutylib import principal
from cutylib.errors import DomainError, InvalidArgument
from cutylib.fields import canonical_uuid
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.telemetry import set_span_attributes
from cutylib.tls import GATEWAY

from .. import operator
from .service import REFUND, REJECT, REPLACE, ClaimResolver

# The merchant's admins, through the gateway.
CALLERS = {"ResolveClaim": {GATEWAY}}
SYSTEM_RPCS: frozenset[str] = frozenset()  # no service calls it as itself
USER_ROLES = frozenset({"admin"})  # the merchant's admins resolve claims, through the gateway
IDEMPOTENCY_KEY = "idempotency-key"
RESOLUTION = {pb.CLAIM_RESOLUTION_REPLACE: REPLACE, pb.CLAIM_RESOLUTION_REFUND: REFUND,
              pb.CLAIM_RESOLUTION_REJECT: REJECT}
MAX_NOTE = 500


class Passed(DomainError):
    """The code pool's answer to a step, handed to the caller unchanged (status, reason, field)."""

    def __init__(self, err: grpc.aio.AioRpcError):
        super().__init__(err.details() or err.code().name.lower(), reason=error_reason(err), field=bad_field(err))
        self.code = err.code()


class ClaimApi(claims_pb2_grpc.ClaimServiceServicer):
    def __init__(self, resolver: ClaimResolver):
        self.resolver = resolver

    async def ResolveClaim(self, request: pb.ResolveClaimRequest, context: grpc.aio.ServicerContext) -> cpb.CodeClaim:
        caller = principal.current()
        caller.require_role("admin")  # the merchant's decision: its admins
        claim_id = canonical_uuid("claim_id", request.claim_id)
        set_span_attributes(claim_id=claim_id)
        if request.resolution not in RESOLUTION:
            raise InvalidArgument("resolution", f"resolution must be REPLACE, REFUND or REJECT, got {request.resolution}")
        resolution = RESOLUTION[request.resolution]
        note = request.note.strip()
        if len(note) > MAX_NOTE or not note.isprintable() or (resolution == REJECT and not note):
            raise InvalidArgument("note", f"note must be {1 if resolution == REJECT else 0}..{MAX_NOTE} printable "
                                          f"characters (a rejection says why), got {len(note)} characters")
        if not principal.metadata_value(context.invocation_metadata(), IDEMPOTENCY_KEY):
            raise InvalidArgument("idempotency_key", "an Idempotency-Key is required to resolve a claim")
        actor = operator.who(caller, context.invocation_metadata())
        try:
            return await self.resolver.resolve(caller, claim_id, resolution, note, actor)
        except grpc.aio.AioRpcError as e:
            raise Passed(e) from None
