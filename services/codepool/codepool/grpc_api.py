"""gRPC <-> use cases: translate protos and check who may call; no business rules here."""
from __future__ import annotations

import json

import grpc

from cuty.codepool.v1 import codepool_pb2 as pb, codepool_pb2_grpc
from cuty.common.v1 import common_pb2
from cutylib import principal, tenancy
from cutylib.errors import NotFound, PermissionDenied, ResourceExhausted
from cutylib.fields import parse_uuid
from cutylib.money import require_money
from cutylib.timestamps import to_timestamp, window
from cutylib.tls import CODEPOOL, GATEWAY, PAYMENTS

from . import digest, domain, incident
from .catalog import Catalog, Product
from .domain import ReservationView, ReserveCommand
from .importer import Chunk, Importer, ImportResult
from .service import OutOfStock, ReservationService
from .stock_events import StockEvents

# Which service may call each RPC (its certificate's identity); the server refuses the rest.
# Catalogue and stock are the gateway's; reservations and plaintext codes the orchestrator's alone;
# the streaming import is the operator CLI's, run in the code pool's own pod.
# Roles (the gateway's policy.py agrees): staff and admins act within their merchant
# (tenancy.merchant_filter), the platform's operator reads stock and masked codes of any merchant
# (audited), never plaintext; `system` (the orchestrator, the CLI) acts for every merchant.
CALLERS = {
    "CreateProduct": {GATEWAY}, "ImportCodes": {CODEPOOL},
    "ImportCodeBatch": {GATEWAY}, "GetStock": {GATEWAY}, "ListCodes": {GATEWAY}, "RevealCode": {GATEWAY},
    "ReserveCodes": {PAYMENTS}, "DeliverCodes": {PAYMENTS}, "ReleaseReservation": {PAYMENTS},
    "GetDeliveredCodes": {PAYMENTS}, "ListStockEvents": {PAYMENTS},
    "GetOrderEvidence": {PAYMENTS},
    "DigestDeliveries": {PAYMENTS}, "SummarizeDeliveries": {PAYMENTS},  # payments' invariant auditor
}
# Where a caller other than the gateway acts as `system` (cutylib.grpc_server.Trust): the saga's
# steps and payments' workers (the orchestrator), the import CLI (the code pool's own pod).
SYSTEM_RPCS = frozenset({"ImportCodes", "ReserveCodes", "DeliverCodes", "ReleaseReservation", "GetDeliveredCodes",
                         "ListStockEvents", "GetOrderEvidence", "DigestDeliveries", "SummarizeDeliveries"})
# The user roles the gateway may bring to the code pool: merchants' staff and admins, the operator.
# No customer reaches it (their codes come through the orchestrator).
USER_ROLES = frozenset({"staff", "admin", "operator"})

STATUS = {domain.RESERVED: pb.RESERVATION_STATUS_RESERVED, domain.DELIVERED: pb.RESERVATION_STATUS_DELIVERED,
          domain.RELEASED: pb.RESERVATION_STATUS_RELEASED}


def actor() -> str:
    """Who acts, as written to the audit log: 'role:subject' (internal callers are 'system')."""
    p = principal.current()
    return f"{p.role}:{p.subject}" if p.subject else p.role


def _reservation(v: ReservationView) -> pb.Reservation:
    return pb.Reservation(
        order_id=v.order_id, order_item_id=v.order_item_id, product_id=v.product_id, customer_id=v.customer_id,
        status=STATUS[v.status], code_ids=list(v.code_ids), quantity=v.quantity, reserve_time=to_timestamp(v.reserved_at),
        expire_time=to_timestamp(v.expires_at), payment_transaction_id=v.payment_transaction_id,
        unit_price=common_pb2.Money(currency_code=v.currency, amount_minor=v.unit_price_minor),
        merchant_id=v.merchant_id)


def product_proto(p: Product) -> pb.Product:
    return pb.Product(id=p.id, sku=p.sku, name=p.name, merchant_id=p.merchant_id,
                      price=common_pb2.Money(currency_code=p.currency, amount_minor=p.price_minor),
                      low_stock_threshold=p.low_stock_threshold,
                      claim_quarantine_threshold=p.claim_quarantine_threshold)


def _import_response(r: ImportResult) -> pb.ImportCodesResponse:
    return pb.ImportCodesResponse(batch_id=r.batch_id, imported=r.imported, rejected_duplicates=r.rejected_duplicates,
                                  accepted=r.accepted, received=r.received)


class CodePoolApi(codepool_pb2_grpc.CodePoolServiceServicer):
    def __init__(self, reservations: ReservationService, catalog: Catalog, importer: Importer,
                 stock_events: StockEvents):
        self.reservations = reservations
        self.catalog = catalog
        self.importer = importer
        self.stock_events = stock_events

    # --- products --------------------------------------------------------------------------------
    async def CreateProduct(self, request: pb.CreateProductRequest, context: grpc.aio.ServicerContext) -> pb.Product:
        p = principal.current()
        p.require_role("admin")  # in its own merchant (a product needs one: `system` has none)
        tenancy.owning_merchant(p)
        name = domain.require_id("name", request.name.strip(), max_length=200)
        currency, amount = require_money("price", request.price.currency_code, request.price.amount_minor)
        # sku, the threshold's range, quantities: the contract's rules (codepool.proto), checked before.
        threshold = (request.low_stock_threshold if request.HasField("low_stock_threshold")
                     else domain.DEFAULT_LOW_STOCK_THRESHOLD)
        return product_proto(await self.catalog.create_product(p, request.sku, name, currency, amount, threshold))

    # --- import ----------------------------------------------------------------------------------
    async def ImportCodes(self, request_iterator, context: grpc.aio.ServicerContext) -> pb.ImportCodesResponse:
        principal.current().require_role("admin", "system")

        async def chunks():
            async for m in request_iterator:
                yield Chunk(m.product_id, m.batch_ref, list(m.codes))

        return _import_response(await self.importer.import_batch(chunks(), actor(), principal.current()))

    async def ImportCodeBatch(self, request: pb.ImportCodeBatchRequest,
                              context: grpc.aio.ServicerContext) -> pb.ImportCodesResponse:
        principal.current().require_role("admin", "system")

        async def one():
            yield Chunk(request.product_id, request.batch_ref, list(request.codes))

        return _import_response(await self.importer.import_batch(one(), actor(), principal.current()))

    # --- reservations ----------------------------------------------------------------------------
    async def ReserveCodes(self, request: pb.ReserveCodesRequest, context: grpc.aio.ServicerContext) -> pb.Reservation:
        principal.current().require_role("system")  # the saga reserves, naming its customer; never a user
        cmd = ReserveCommand(
            order_id=domain.require_id("order_id", request.order_id),
            order_item_id=domain.require_id("order_item_id", request.order_item_id),
            product_id=parse_uuid("product_id", request.product_id),
            quantity=request.quantity,
            customer_id=domain.require_id("customer_id", request.customer_id))
        try:
            return _reservation(await self.reservations.reserve(cmd, actor()))
        except OutOfStock as e:
            raise ResourceExhausted(e.message, reason=e.reason, detail=pb.OutOfStock(
                product_id=str(e.product_id), requested=e.requested, available=e.available)) from None

    async def DeliverCodes(self, request: pb.DeliverCodesRequest, context: grpc.aio.ServicerContext) -> pb.Reservation:
        order_id = domain.require_id("order_id", request.order_id)
        transaction_id = domain.require_id("payment_transaction_id", request.payment_transaction_id,
                                           max_length=domain.MAX_TRANSACTION_ID_LENGTH)
        principal.current().require_role("system")  # finishing a purchase: the saga, never a user
        return _reservation(await self.reservations.deliver(order_id, transaction_id, actor()))

    async def ReleaseReservation(self, request: pb.ReleaseReservationRequest,
                                 context: grpc.aio.ServicerContext) -> pb.Reservation:
        order_id = domain.require_id("order_id", request.order_id)
        principal.current().require_role("system")  # releasing: the saga, never a user
        return _reservation(await self.reservations.release(order_id, actor()))

    # --- stock and codes -------------------------------------------------------------------------
    async def GetStock(self, request: pb.GetStockRequest, context: grpc.aio.ServicerContext) -> pb.Stock:
        p = principal.current()
        p.require_role("staff", "admin", "operator", "system")
        tenancy.merchant_filter(p)
        product_id = parse_uuid("product_id", request.product_id)
        s = await self.catalog.stock(p, product_id, actor())
        return pb.Stock(product_id=str(product_id), available=s["available"], reserved=s["reserved"],
                        delivered=s["delivered"], quarantined=s["quarantined"], revoked=s["revoked"])

    async def ListCodes(self, request: pb.ListCodesRequest, context: grpc.aio.ServicerContext) -> pb.ListCodesResponse:
        p = principal.current()
        p.require_role("staff", "admin", "operator", "system")
        tenancy.merchant_filter(p)
        product_id = parse_uuid("product_id", request.product_id)
        items, last = await self.catalog.list_codes(p, product_id, domain.decode_page_token(request.page_token),
                                                    domain.page_size(request.page_size), actor())
        return pb.ListCodesResponse(
            codes=[pb.MaskedCode(id=i, status=s, masked_value=m) for i, s, m in items],
            next_page_token=domain.encode_page_token(last) if last is not None else "")

    async def RevealCode(self, request: pb.RevealCodeRequest, context: grpc.aio.ServicerContext) -> pb.RevealedCode:
        p = principal.current()
        p.require_role("admin")  # never the operator: plaintext is the merchant's own admin's
        tenancy.merchant_filter(p)
        code_id = parse_uuid("code_id", request.code_id)
        value, views = await self.catalog.reveal(p, code_id, actor())
        return pb.RevealedCode(id=str(code_id), value=value, view_count=views)

    async def GetDeliveredCodes(self, request: pb.GetDeliveredCodesRequest,
                                context: grpc.aio.ServicerContext) -> pb.DeliveredCodes:
        p = principal.current()
        order_id = domain.require_id("order_id", request.order_id)
        if p.role == "customer":
            customer_id = p.subject
            if request.customer_id and request.customer_id != customer_id:
                raise NotFound(f"no order {order_id} for this customer")
        elif p.role == "system":
            customer_id = domain.require_id("customer_id", request.customer_id)
        else:
            raise PermissionDenied(f"role {p.role!r} sees codes masked (ListCodes) or through RevealCode")
        codes = await self.catalog.delivered_codes(order_id, customer_id, actor())
        return pb.DeliveredCodes(order_id=order_id, codes=[pb.PlainCode(id=i, value=v) for i, v in codes])

    # --- the outbox of merchant events ----------------------------------------------------------
    async def ListStockEvents(self, request: pb.ListStockEventsRequest,
                              context: grpc.aio.ServicerContext) -> pb.ListStockEventsResponse:
        principal.current().require_role("system")  # the orchestrator's relay: every merchant's events
        events = await self.stock_events.after(request.after_seq, domain.page_size(request.page_size or 100))
        return pb.ListStockEventsResponse(events=[
            pb.StockEvent(seq=e.seq, id=e.id, merchant_id=e.merchant_id, type=e.type, payload_json=e.payload_json,
                          create_time=to_timestamp(e.created_at), order_id=e.order_id) for e in events])

    async def GetOrderEvidence(self, request: pb.GetOrderEvidenceRequest,
                               context: grpc.aio.ServicerContext) -> pb.OrderEvidence:
        principal.current().require_role("system")  # the orchestrator's operator command, for any merchant
        order_id = domain.require_id("order_id", request.order_id)
        by = request.requested_by.strip()  # the contract: 1..100 characters, not blank
        document = await incident.order_evidence(self.catalog.pool, self.catalog.keyring, order_id, by=by)
        if document is None:
            raise NotFound(f"no order {order_id}")
        return pb.OrderEvidence(document_json=json.dumps(document, separators=(",", ":")))

    async def DigestDeliveries(self, request: pb.DigestDeliveriesRequest,
                               context: grpc.aio.ServicerContext) -> pb.DigestDeliveriesResponse:
        principal.current().require_role("system")  # the auditor reads every merchant's orders
        start, end = window(request, digest.MAX_WINDOW_SECONDS)
        orders, duplicates, token = await digest.digest_deliveries(self.catalog.pool, start, end, request.page_size,
                                                                   request.page_token, request.bucket_count,
                                                                   list(request.buckets))
        return pb.DigestDeliveriesResponse(
            orders=[pb.OrderDigest(order_id=o.order_id, merchant_id=o.merchant_id, product_id=o.product_id,
                                   quantity=o.quantity, delivered=o.delivered, revoked=o.revoked, replaced=o.replaced,
                                   payment_transaction_id=o.payment_transaction_id,
                                   reserve_time=to_timestamp(o.reserved_at)) for o in orders],
            duplicates=[pb.DuplicateDelivery(code_id=d.code_id, merchant_id=d.merchant_id, order_ids=d.order_ids)
                        for d in duplicates],
            next_page_token=token)

    async def SummarizeDeliveries(self, request: pb.SummarizeDeliveriesRequest,
                                  context: grpc.aio.ServicerContext) -> pb.SummarizeDeliveriesResponse:
        principal.current().require_role("system")  # the auditor reads every merchant's orders
        start, end = window(request, digest.MAX_WINDOW_SECONDS)
        found = await digest.summarize_deliveries(self.catalog.pool, start, end, request.bucket_count)
        return pb.SummarizeDeliveriesResponse(buckets=[common_pb2.DigestBucket(
            bucket=b.bucket, count=b.count, fingerprint=b.fingerprint) for b in found])
