"""cuty.payments.v1.PaymentService: proto <-> core translation only; errors are raised and
cutylib's interceptor turns them into statuses with details."""
from __future__ import annotations

import grpc

from cuty.payments.v1 import payments_pb2 as pb
from cuty.payments.v1 import payments_pb2_grpc
from cutylib import principal
from cutylib.errors import InvalidArgument, NotFound
from cutylib.fields import canonical_uuid
from cutylib import paging, tenancy
from cutylib.money import require_amount, require_currency
from cutylib.telemetry import set_span_attributes
from cutylib.tls import GATEWAY, PAYMENTS

from . import operator
from .service import PaymentsCore
from .webhooks import WebhookInbox

# Which service may call each RPC (its certificate's identity); the server refuses the rest.
# A refund by hand is for the payments service's own identity (its operator tooling, as `system`);
# the gateway reads timelines and relays the PSP's webhooks as raw bytes. The saga charges, reads
# and cancels payments in process (checkout/ports.Payments), never over gRPC.
CALLERS = {
    "RefundPayment": {PAYMENTS}, "GetPaymentTimeline": {GATEWAY}, "HandlePspWebhook": {GATEWAY},
    "LookupPayment": {GATEWAY},  # Staff find a payment by the PSP's intent id
    "IssueRefund": {GATEWAY},  # the merchant's staff refund, fully or partly (through the gateway only)
}
# Where a caller other than the gateway acts as `system` (cutylib.grpc_server.Trust).
SYSTEM_RPCS = frozenset({"RefundPayment"})
# The user roles the gateway may bring (its routes to this service: staff, admins, the operator).
USER_ROLES = frozenset({"staff", "admin", "operator"})

SIGNATURE_KEY = "cuty-signature"
IDEMPOTENCY_KEY = "idempotency-key"
READ_ROLES = ("system", "staff", "admin", "operator")  # staff and admins within their merchant
MAX_REASON = 200
# Who refunds through the API. The merchant's staff and admins (within their merchant),
# and `system` (the service's own tooling). Not the operator: support reads across merchants, but
# giving a merchant's money back is the merchant's decision (docs/payments.md, "Refunds").
REFUND_ROLES = ("system", "staff", "admin")


def _payment_id(value: str) -> str:
    if not value:
        raise InvalidArgument("payment_id", "payment_id is required")
    pid = canonical_uuid("payment_id", value)
    set_span_attributes(payment_id=pid)
    return pid


class PaymentApi(payments_pb2_grpc.PaymentServiceServicer):
    def __init__(self, core: PaymentsCore, inbox: WebhookInbox):
        self.core = core
        self.inbox = inbox

    async def RefundPayment(self, request: pb.RefundPaymentRequest, context: grpc.aio.ServicerContext) -> pb.Payment:
        principal.current().require_role("system")  # a refund finishes a purchase: never a user
        key = request.idempotency_key or principal.metadata_value(context.invocation_metadata(), IDEMPOTENCY_KEY)
        if not key:
            raise InvalidArgument("idempotency_key", "idempotency_key is required for a refund")
        pid = _payment_id(request.payment_id)
        actor = operator.who(principal.current(), context.invocation_metadata())
        note = refund_note(actor, request.reason)
        return (await self.core.refund(pid, key, note=note, actor=actor)).to_proto()

    async def IssueRefund(self, request: pb.IssueRefundRequest, context: grpc.aio.ServicerContext) -> pb.Refund:
        caller = principal.current()
        caller.require_role(*REFUND_ROLES)
        pid = _payment_id(request.payment_id)
        key = request.idempotency_key or principal.metadata_value(context.invocation_metadata(), IDEMPOTENCY_KEY)
        if not key:
            raise InvalidArgument("idempotency_key", "an Idempotency-Key is required for a refund")
        reason = request.reason.strip()  # 1..500 printable characters: the contract's rule (payments.proto)
        amount = currency = None
        if request.HasField("amount"):
            amount = require_amount("amount.amount_minor", request.amount.amount_minor, positive=True)
            currency = require_currency("amount.currency_code", request.amount.currency_code)
        # Staff and admins act within their merchant; a payment of another merchant is not found.
        merchant = tenancy.merchant_filter(caller)
        if merchant is None:  # system: the payment's own merchant
            merchant = (await self.core.get(pid)).merchant_id
        # Delivered codes are not refundable by staff; the merchant's admin may, naming the amount.
        codes_ok = caller.role == "system" or (caller.role == "admin" and amount is not None)
        actor = operator.who(caller, context.invocation_metadata())
        refund = await self.core.issue_refund(merchant, pid, key, amount_minor=amount, currency=currency,
                                              reason=reason, actor=actor, codes_delivered_ok=codes_ok,
                                              note=refund_note(actor, reason), seen_by=caller)
        set_span_attributes(payment_id=pid)
        return refund.to_proto(await self.core.get(pid))

    async def GetPaymentTimeline(self, request: pb.GetPaymentTimelineRequest,
                                 context: grpc.aio.ServicerContext) -> pb.PaymentTimeline:
        caller = principal.current()
        caller.require_role(*READ_ROLES)
        pid = _payment_id(request.payment_id)
        size, after = paging.page_size(request.page_size), paging.decode_seq(request.page_token)
        events = await self.core.timeline(pid, seen_by=caller, after_seq=after, limit=size)
        await self.core.audit_operator_read(caller, "GetPaymentTimeline", pid, None)
        more = len(events) == size
        return pb.PaymentTimeline(payment_id=pid, events=[e.to_proto() for e in events],
                                  next_page_token=paging.encode_seq(events[-1].seq) if more else "")

    async def LookupPayment(self, request: pb.LookupPaymentRequest, context: grpc.aio.ServicerContext) -> pb.Payment:
        caller = principal.current()
        caller.require_role(*READ_ROLES)
        intent = request.psp_intent_id  # 1..255 printable ASCII, no surrounding spaces: the contract's rule
        view = await self.core.find_by_intent(intent, seen_by=caller)
        if view is None:
            raise NotFound(f"no payment for PSP intent {intent!r}")
        await self.core.audit_operator_read(caller, "LookupPayment", view.id, view.merchant_id)
        set_span_attributes(payment_id=view.id, checkout_id=view.checkout_id or "")
        out = view.to_proto()
        out.ClearField("next_action")  # the customer's to use, not staff's
        out.client_secret = ""
        return out

    async def HandlePspWebhook(self, request: pb.PspWebhookRequest,
                               context: grpc.aio.ServicerContext) -> pb.PspWebhookResponse:
        # Authenticated by the signature over the raw body, not by a principal: the PSP is no user.
        header = principal.metadata_value(context.invocation_metadata(), SIGNATURE_KEY)
        return pb.PspWebhookResponse(result=await self.inbox.handle(request.payload, header))


def refund_note(actor: str, reason: str) -> str:
    """The timeline note of a refund asked for through the API (the saga's own refunds say
    "refund requested"): who asked, and why."""
    reason = " ".join(reason.split())[:MAX_REASON]
    return f"refund requested by {actor}" + (f": {reason}" if reason else "")
