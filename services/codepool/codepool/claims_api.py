"""gRPC <-> claims and batches (CodeClaimService; docs/codepool.md, "Claims, replacement and batch
quarantine"): translate protos, check who may call; no business rules here."""
from __future__ import annotations

import grpc

from cuty.codepool.v1 import claims_pb2 as pb, claims_pb2_grpc
from cuty.common.v1 import common_pb2
from cutylib import principal
from cutylib.errors import InvalidArgument, PermissionDenied
from cutylib.fields import parse_uuid
from cutylib.timestamps import to_timestamp
from cutylib.tls import GATEWAY, PAYMENTS

from . import domain
from .batches import Batches
from .claims import Claim, Claims, require_reason
from .grpc_api import actor, product_proto

# Opening and reading claims, thresholds and batches are the gateway's (buyers, staff, admins);
# settling a claim (a replacement is a delivery, a refund moves money) is the orchestrator's alone,
# which also lists the claims it is refunding.
CALLERS = {
    "OpenCodeClaim": {GATEWAY}, "GetCodeClaim": {GATEWAY, PAYMENTS}, "ListCodeClaims": {GATEWAY, PAYMENTS},
    "SettleCodeClaim": {PAYMENTS}, "SetClaimThreshold": {GATEWAY}, "ListBatches": {GATEWAY},
    "ReleaseBatch": {GATEWAY}, "RetireBatch": {GATEWAY}, "ExportBatchClaims": {GATEWAY},
}
# Where a caller other than the gateway acts as `system` (cutylib.grpc_server.Trust): payments'
# claim resolution, which reads and settles claims as itself.
SYSTEM_RPCS = frozenset({"GetCodeClaim", "ListCodeClaims", "SettleCodeClaim"})
# The user roles the gateway may bring (its routes here): buyers open claims, merchants handle them.
USER_ROLES = frozenset({"customer", "staff", "admin"})

IDEMPOTENCY_KEY = "idempotency-key"
KIND = {pb.CLAIM_KIND_DOES_NOT_WORK: "does_not_work", pb.CLAIM_KIND_ALREADY_USED: "already_used"}
KIND_PB = {v: k for k, v in KIND.items()}
STATUS = {pb.CLAIM_STATUS_OPEN: "open", pb.CLAIM_STATUS_REFUNDING: "refunding", pb.CLAIM_STATUS_REPLACED: "replaced",
          pb.CLAIM_STATUS_REFUNDED: "refunded", pb.CLAIM_STATUS_REJECTED: "rejected"}
STATUS_PB = {v: k for k, v in STATUS.items()}
STEP = {pb.SETTLE_STEP_REPLACE: "replace", pb.SETTLE_STEP_REJECT: "reject", pb.SETTLE_STEP_REFUND: "refund",
        pb.SETTLE_STEP_REFUNDED: "refunded", pb.SETTLE_STEP_REOPEN: "reopen"}
BATCH_STATUS = {"active": pb.BATCH_STATUS_ACTIVE, "quarantined": pb.BATCH_STATUS_QUARANTINED,
                "retired": pb.BATCH_STATUS_RETIRED}


def claim_proto(c: Claim) -> pb.CodeClaim:
    out = pb.CodeClaim(
        id=c.id, merchant_id=c.merchant_id, checkout_id=c.order_id, product_id=c.product_id, batch_id=c.batch_id,
        code_id=c.code_id, customer_id=c.customer_id, kind=KIND_PB[c.kind], reason=c.reason, status=STATUS_PB[c.status],
        opened_by=c.opened_by, open_time=to_timestamp(c.opened_at), resolved_by=c.resolved_by,
        resolution_note=c.resolution_note, replacement_code_id=c.replacement_code_id, refund_id=c.refund_id,
        refund_attempt=c.refund_attempt)
    if c.resolved_at is not None:
        out.resolve_time.CopyFrom(to_timestamp(c.resolved_at))
    if c.refund_minor is not None:
        out.refund.CopyFrom(common_pb2.Money(currency_code=c.currency, amount_minor=c.refund_minor))
    return out


def _batch_proto(r, moved: int = 0) -> pb.Batch:
    out = pb.Batch(id=str(r["id"]), product_id=str(r["product_id"]), batch_ref=r["batch_ref"],
                   status=BATCH_STATUS[r["status"]], imported=r["imported"], claims=r["claims"],
                   counted_claims=r["counted_claims"], create_time=to_timestamp(r["created_at"]), codes_moved=moved)
    for field, column in (("quarantine_time", "quarantined_at"), ("release_time", "released_at"),
                          ("retire_time", "retired_at")):
        if r[column] is not None:
            getattr(out, field).CopyFrom(to_timestamp(r[column]))
    return out


def _optional_uuid(field: str, value: str):
    return parse_uuid(field, value) if value else None


class CodeClaimApi(claims_pb2_grpc.CodeClaimServiceServicer):
    def __init__(self, claims: Claims, batches: Batches):
        self.claims = claims
        self.batches = batches

    async def OpenCodeClaim(self, request: pb.OpenCodeClaimRequest, context: grpc.aio.ServicerContext) -> pb.CodeClaim:
        p = principal.current()
        p.require_role("customer", "staff", "admin")
        order_id = domain.require_id("checkout_id", request.checkout_id)
        code_id = parse_uuid("code_id", request.code_id)
        reason = require_reason("reason", request.reason)
        key = principal.metadata_value(context.invocation_metadata(), IDEMPOTENCY_KEY)
        if not key or len(key) > 255:
            raise InvalidArgument("idempotency_key", "an Idempotency-Key (1..255 characters) is required to open a claim")
        return claim_proto(await self.claims.open(p, order_id, code_id, KIND[request.kind], reason, key, actor()))

    async def GetCodeClaim(self, request: pb.GetCodeClaimRequest, context: grpc.aio.ServicerContext) -> pb.CodeClaim:
        p = principal.current()
        p.require_role("customer", "staff", "admin", "system")
        return claim_proto(await self.claims.get(p, parse_uuid("claim_id", request.claim_id)))

    async def ListCodeClaims(self, request: pb.ListCodeClaimsRequest,
                             context: grpc.aio.ServicerContext) -> pb.ListCodeClaimsResponse:
        p = principal.current()
        p.require_role("customer", "staff", "admin", "system")
        if request.all_merchants and p.role != "system":
            raise PermissionDenied("only an internal caller lists every merchant's claims")
        claims, token = await self.claims.list(
            p, status=STATUS.get(request.status), product_id=_optional_uuid("product_id", request.product_id),
            batch_id=_optional_uuid("batch_id", request.batch_id), page_size=request.page_size,
            page_token=request.page_token, all_merchants=request.all_merchants)
        return pb.ListCodeClaimsResponse(claims=[claim_proto(c) for c in claims], next_page_token=token)

    async def SettleCodeClaim(self, request: pb.SettleCodeClaimRequest,
                              context: grpc.aio.ServicerContext) -> pb.CodeClaim:
        principal.current().require_role("system")  # a replacement delivers, a refund moves money: the orchestrator
        claim_id = parse_uuid("claim_id", request.claim_id)
        step = STEP[request.step]
        note = require_reason("note", request.note, required=step == "reject")
        if step == "refunded" and not request.refund_id:
            raise InvalidArgument("refund_id", "refund_id (the payment refund's id) is required once refunded")
        who = domain.require_id("actor", request.actor or actor(), max_length=200)
        return claim_proto(await self.claims.settle(claim_id, step, actor=who, note=note, refund_id=request.refund_id))

    async def SetClaimThreshold(self, request: pb.SetClaimThresholdRequest, context: grpc.aio.ServicerContext):
        p = principal.current()
        p.require_role("admin")
        product_id = parse_uuid("product_id", request.product_id)
        # the contract bounds it (1..1000000); unset: never quarantined
        threshold = request.claim_quarantine_threshold if request.HasField("claim_quarantine_threshold") else None
        return product_proto(await self.batches.set_threshold(p, product_id, threshold))

    async def ListBatches(self, request: pb.ListBatchesRequest,
                          context: grpc.aio.ServicerContext) -> pb.ListBatchesResponse:
        p = principal.current()
        p.require_role("staff", "admin")
        rows = await self.batches.list(p, parse_uuid("product_id", request.product_id))
        return pb.ListBatchesResponse(batches=[_batch_proto(r) for r in rows])

    async def _decide(self, request: pb.BatchDecisionRequest, step: str) -> pb.Batch:
        p = principal.current()
        p.require_role("admin")
        product_id = parse_uuid("product_id", request.product_id)
        batch_id = parse_uuid("batch_id", request.batch_id)
        note = require_reason("note", request.note, required=False)
        row, moved = await self.batches.decide(p, product_id, batch_id, step, actor(), note)
        return _batch_proto(row, moved)

    async def ReleaseBatch(self, request: pb.BatchDecisionRequest, context: grpc.aio.ServicerContext) -> pb.Batch:
        return await self._decide(request, "release")

    async def RetireBatch(self, request: pb.BatchDecisionRequest, context: grpc.aio.ServicerContext) -> pb.Batch:
        return await self._decide(request, "retire")

    async def ExportBatchClaims(self, request: pb.ExportBatchClaimsRequest,
                                context: grpc.aio.ServicerContext) -> pb.ClaimExport:
        p = principal.current()
        p.require_role("admin")  # code values: the merchant's admin's, audited (like RevealCode)
        product_id = parse_uuid("product_id", request.product_id)
        batch_id = parse_uuid("batch_id", request.batch_id)
        text, rows = await self.batches.export(p, product_id, batch_id, actor())
        return pb.ClaimExport(filename=f"claims-{batch_id}.csv", content_type="text/csv", csv=text, rows=rows)
