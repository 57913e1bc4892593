"""Who may call which public RPC, as one table keyed by RPC: the gateway's routes (docs/gateway.md,
"Authentication and roles") and the internal clients that call the same RPCs over gRPC with their
own certificates (cutylib.clients, docs/clients.md) are held to the same roles by it.

The gateway checks roles; ownership ("its customer") is the orchestrator's to check, because only
it knows whose checkout is whose; it answers NOT_FOUND for someone else's, never PERMISSION_DENIED,
so existence does not leak. An annotated RPC missing from this table is refused to everyone
(fail closed) and a unit test names it.
"""
from __future__ import annotations

from dataclasses import dataclass

CUSTOMER, STAFF, ADMIN, OPERATOR = "customer", "staff", "admin", "operator"
SIGNED_IN = frozenset({CUSTOMER, STAFF, ADMIN, OPERATOR})
# Staff and admins act within their merchant (the services filter by it); the platform's
# operator (support) reads across merchants, and the services audit every such read.
READERS = frozenset({STAFF, ADMIN, OPERATOR})
TOKEN_ROLES = SIGNED_IN  # roles a token may carry; `system` is for internal callers only


@dataclass(frozen=True)
class Access:
    roles: frozenset[str] | None  # None: no token needed
    idempotency_key: bool = False  # Idempotency-Key header required, forwarded as metadata
    # HTTP header -> gRPC metadata key, passed through unchanged.
    forward_headers: tuple[tuple[str, str], ...] = ()

    @property
    def public(self) -> bool:
        return self.roles is None


def _roles(*r: str) -> frozenset[str]:
    return frozenset(r)


POLICY: dict[str, Access] = {
    "cuty.booking.v1.BookingService.CreateSalon": Access(_roles(ADMIN)),
    # The salon's merchant's admins change its cancellation policy (another's: 404).
    "cuty.booking.v1.BookingService.SetCancellationPolicy": Access(_roles(ADMIN)),
    "cuty.booking.v1.BookingService.CreateResource": Access(_roles(ADMIN)),
    "cuty.booking.v1.BookingService.BatchCreateSlots": Access(_roles(ADMIN)),
    "cuty.booking.v1.BookingService.ListSlots": Access(SIGNED_IN),
    # A salon's agenda (customers' ids): its merchant's staff and admins, the operator.
    # A day's agenda names customers: the salon's merchant only (the operator's reads must be
    # audited, and booking keeps no read audit).
    "cuty.booking.v1.BookingService.ListBookings": Access(_roles(STAFF, ADMIN)),
    # Services and working hours (docs/booking.md): the salon's merchant's admins define them
    # (another merchant's salon: 404); every signed-in user reads services and free times, staff and
    # admins of their merchant's salons only.
    "cuty.booking.v1.BookingService.CreateService": Access(_roles(ADMIN)),
    "cuty.booking.v1.BookingService.ListServices": Access(SIGNED_IN),
    "cuty.booking.v1.BookingService.SetWorkingHours": Access(_roles(ADMIN)),
    "cuty.booking.v1.BookingService.SetHoursOverride": Access(_roles(ADMIN)),
    "cuty.booking.v1.BookingService.SetBookingSettings": Access(_roles(ADMIN)),
    "cuty.booking.v1.BookingService.GetAvailability": Access(SIGNED_IN),
    "cuty.codepool.v1.CodePoolService.CreateProduct": Access(_roles(ADMIN)),
    "cuty.codepool.v1.CodePoolService.ImportCodeBatch": Access(_roles(ADMIN)),
    "cuty.codepool.v1.CodePoolService.GetStock": Access(READERS),
    "cuty.codepool.v1.CodePoolService.ListCodes": Access(READERS),
    "cuty.codepool.v1.CodePoolService.RevealCode": Access(_roles(ADMIN)),
    # After a code is sold (docs/codepool.md, "Claims"): the buyer claims on their own order, the
    # merchant's staff and admins on their merchant's (another's: 404); the operator does not act
    # for a merchant. Lists and reads are filtered the same way.
    "cuty.codepool.v1.CodeClaimService.OpenCodeClaim": Access(_roles(CUSTOMER, STAFF, ADMIN), idempotency_key=True),
    "cuty.codepool.v1.CodeClaimService.GetCodeClaim": Access(_roles(CUSTOMER, STAFF, ADMIN)),
    "cuty.codepool.v1.CodeClaimService.ListCodeClaims": Access(_roles(CUSTOMER, STAFF, ADMIN)),
    # A product's claims threshold and its batches' fate are its merchant's admins' decisions; staff read
    # the batches; the claim export holds code values (like RevealCode): admins only, audited.
    "cuty.codepool.v1.CodeClaimService.SetClaimThreshold": Access(_roles(ADMIN)),
    "cuty.codepool.v1.CodeClaimService.ListBatches": Access(_roles(STAFF, ADMIN)),
    "cuty.codepool.v1.CodeClaimService.ReleaseBatch": Access(_roles(ADMIN)),
    "cuty.codepool.v1.CodeClaimService.RetireBatch": Access(_roles(ADMIN)),
    "cuty.codepool.v1.CodeClaimService.ExportBatchClaims": Access(_roles(ADMIN)),
    # The merchant's admin resolves a claim: a replacement or a refund (through the orchestrator).
    "cuty.payments.v1.ClaimService.ResolveClaim": Access(_roles(ADMIN), idempotency_key=True),
    "cuty.payments.v1.CheckoutService.CreateCheckout": Access(_roles(CUSTOMER), idempotency_key=True),
    "cuty.payments.v1.CheckoutService.PayCheckout": Access(_roles(CUSTOMER), idempotency_key=True),
    # Its customer, and whoever reads the merchant's sales: staff, admins (an admin can do what
    # staff can) and the operator (docs/gateway.md).
    "cuty.payments.v1.CheckoutService.GetCheckout": Access(READERS | {CUSTOMER}),
    # The customer's own (before the purchase; after it, a booking per its cancellation
    # policy); the merchant's staff and admins cancel a completed booking with a full refund and a
    # reason (another merchant's: 404). The operator does not give a merchant's money back.
    "cuty.payments.v1.CheckoutService.CancelCheckout": Access(_roles(CUSTOMER, STAFF, ADMIN)),
    # The customer reschedules their own completed booking (until its free-cancellation
    # deadline), the merchant's staff and admins any of theirs (another merchant's: 404); the operator
    # does not move a merchant's bookings.
    "cuty.payments.v1.CheckoutService.RescheduleCheckout": Access(_roles(CUSTOMER, STAFF, ADMIN), idempotency_key=True),
    # A customer's own checkouts; staff and admins their merchant's; the operator all (audited).
    "cuty.payments.v1.CheckoutService.ListCheckouts": Access(READERS | {CUSTOMER}),
    # Live updates as Server-Sent Events, for whoever may GetCheckout it; the SSE
    # Last-Event-ID header goes to the service, which resumes after that event.
    "cuty.payments.v1.CheckoutService.WatchCheckout": Access(
        READERS | {CUSTOMER}, forward_headers=(("last-event-id", "last-event-id"),)),
    # The merchant's admin, or the platform's operator, retries a NEEDS_ATTENTION checkout.
    "cuty.payments.v1.CheckoutService.RetryCheckout": Access(_roles(ADMIN, OPERATOR)),
    # Staff book for a customer (phone, walk-in): the salon's merchant's staff and admins (another
    # merchant's slot or checkout: 404); they record a payment at the desk and a no-show. Neither
    # customers (they buy with CreateCheckout) nor the operator (who does not sell for a merchant).
    "cuty.payments.v1.CheckoutService.CreateStaffCheckout": Access(_roles(STAFF, ADMIN), idempotency_key=True),
    "cuty.payments.v1.CheckoutService.MarkPaidAtVenue": Access(_roles(STAFF, ADMIN)),
    "cuty.payments.v1.CheckoutService.MarkNoShow": Access(_roles(STAFF, ADMIN)),
    "cuty.payments.v1.PaymentService.GetPaymentTimeline": Access(READERS),
    # Staff find the payment behind a PSP intent id (GET /v1/payments:lookup?pspIntentId=).
    "cuty.payments.v1.PaymentService.LookupPayment": Access(READERS),
    # The merchant's staff (and admins) give money back; the operator reads, it does not refund.
    "cuty.payments.v1.PaymentService.IssueRefund": Access(_roles(STAFF, ADMIN), idempotency_key=True),
    # A merchant's webhook endpoints and their delivery logs are its admins'
    # (the endpoint secrets and the integration are theirs; the operator does not read them).
    "cuty.payments.v1.WebhookEndpointService.CreateWebhookEndpoint": Access(_roles(ADMIN)),
    "cuty.payments.v1.WebhookEndpointService.ListWebhookEndpoints": Access(_roles(ADMIN)),
    "cuty.payments.v1.WebhookEndpointService.DeleteWebhookEndpoint": Access(_roles(ADMIN)),
    "cuty.payments.v1.WebhookEndpointService.ListWebhookDeliveries": Access(_roles(ADMIN)),
    "cuty.payments.v1.WebhookEndpointService.RedeliverWebhook": Access(_roles(ADMIN)),
    # The PSP has no token; the orchestrator verifies the HMAC over the raw body instead.
    "cuty.payments.v1.PaymentService.HandlePspWebhook": Access(
        None, forward_headers=(("cuty-signature", "cuty-signature"),)),
}

DENY_ALL = Access(frozenset())


def access_for(rpc: str) -> Access:
    return POLICY.get(rpc, DENY_ALL)


def rpc_name(method: str) -> str:
    """`/cuty.booking.v1.BookingService/ListSlots` (a gRPC method path) -> the table's key,
    `cuty.booking.v1.BookingService.ListSlots`."""
    return method.lstrip("/").replace("/", ".")
