"""Who may call which route: the table itself is cutylib.access (the services hold internal clients
to it too); this module adds what only the gateway needs, each route's load class and deadline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cutylib.access import (  # noqa: F401 - the gateway's modules and tests name them here
    ADMIN, CUSTOMER, DENY_ALL, OPERATOR, POLICY, READERS, SIGNED_IN, STAFF, TOKEN_ROLES, Access, access_for,
)

# Load: which work the gateway keeps when the backends are saturated (admission.py), and how long a
# call of each route may take (the gRPC deadline; the cap of a client's Request-Timeout header).
# CRITICAL finishes a purchase already started (paying, the PSP's word on it, the buyer watching or
# reading it, cancelling it): it may use the whole concurrency limit and a reserved headroom.
# NORMAL is new work (a new checkout, a merchant's writes), SHEDDABLE the reads that can be asked
# again later; they get a share of the limit only, so they are refused first.
CRITICAL, NORMAL, SHEDDABLE = "critical", "normal", "sheddable"
# Longest call per kind of route, in seconds (CUTY_GATEWAY_DEADLINE_SECONDS caps them all): a read,
# a write, a write that may wait on the PSP's synchronous answer, a stream (CUTY_SSE_MAX_SECONDS).
READ, WRITE, PSP, STREAM = 5.0, 10.0, 15.0, math.inf


@dataclass(frozen=True)
class Load:
    criticality: str
    max_seconds: float


LOAD: dict[str, Load] = {
    "cuty.booking.v1.BookingService.CreateSalon": Load(NORMAL, WRITE),
    "cuty.booking.v1.BookingService.SetCancellationPolicy": Load(NORMAL, WRITE),
    "cuty.booking.v1.BookingService.CreateResource": Load(NORMAL, WRITE),
    "cuty.booking.v1.BookingService.BatchCreateSlots": Load(NORMAL, WRITE),
    "cuty.booking.v1.BookingService.ListSlots": Load(SHEDDABLE, READ),
    "cuty.booking.v1.BookingService.ListBookings": Load(SHEDDABLE, READ),
    "cuty.booking.v1.BookingService.CreateService": Load(NORMAL, WRITE),
    "cuty.booking.v1.BookingService.ListServices": Load(SHEDDABLE, READ),
    "cuty.booking.v1.BookingService.SetWorkingHours": Load(NORMAL, WRITE),
    "cuty.booking.v1.BookingService.SetHoursOverride": Load(NORMAL, WRITE),
    "cuty.booking.v1.BookingService.SetBookingSettings": Load(NORMAL, WRITE),
    "cuty.booking.v1.BookingService.GetAvailability": Load(SHEDDABLE, READ),
    "cuty.codepool.v1.CodePoolService.CreateProduct": Load(NORMAL, WRITE),
    "cuty.codepool.v1.CodePoolService.ImportCodeBatch": Load(NORMAL, WRITE),
    "cuty.codepool.v1.CodePoolService.GetStock": Load(SHEDDABLE, READ),
    "cuty.codepool.v1.CodePoolService.ListCodes": Load(SHEDDABLE, READ),
    "cuty.codepool.v1.CodePoolService.RevealCode": Load(SHEDDABLE, READ),
    "cuty.codepool.v1.CodeClaimService.OpenCodeClaim": Load(NORMAL, WRITE),
    "cuty.codepool.v1.CodeClaimService.GetCodeClaim": Load(SHEDDABLE, READ),
    "cuty.codepool.v1.CodeClaimService.ListCodeClaims": Load(SHEDDABLE, READ),
    "cuty.codepool.v1.CodeClaimService.SetClaimThreshold": Load(NORMAL, WRITE),
    "cuty.codepool.v1.CodeClaimService.ListBatches": Load(SHEDDABLE, READ),
    "cuty.codepool.v1.CodeClaimService.ReleaseBatch": Load(NORMAL, WRITE),
    "cuty.codepool.v1.CodeClaimService.RetireBatch": Load(NORMAL, WRITE),
    "cuty.codepool.v1.CodeClaimService.ExportBatchClaims": Load(SHEDDABLE, READ),
    # A refund may wait on the PSP's answer.
    "cuty.payments.v1.ClaimService.ResolveClaim": Load(NORMAL, PSP),
    "cuty.payments.v1.CheckoutService.CreateCheckout": Load(NORMAL, WRITE),
    "cuty.payments.v1.CheckoutService.PayCheckout": Load(CRITICAL, PSP),
    "cuty.payments.v1.CheckoutService.GetCheckout": Load(CRITICAL, READ),
    # A cancel releases what the checkout holds (and may refund through the PSP).
    "cuty.payments.v1.CheckoutService.CancelCheckout": Load(CRITICAL, PSP),
    "cuty.payments.v1.CheckoutService.RescheduleCheckout": Load(NORMAL, PSP),
    "cuty.payments.v1.CheckoutService.ListCheckouts": Load(SHEDDABLE, READ),
    "cuty.payments.v1.CheckoutService.WatchCheckout": Load(CRITICAL, STREAM),
    "cuty.payments.v1.CheckoutService.RetryCheckout": Load(NORMAL, PSP),
    # A payment link's creation asks the PSP for the intent of the hosted page.
    "cuty.payments.v1.CheckoutService.CreateStaffCheckout": Load(NORMAL, PSP),
    "cuty.payments.v1.CheckoutService.MarkPaidAtVenue": Load(NORMAL, WRITE),
    "cuty.payments.v1.CheckoutService.MarkNoShow": Load(NORMAL, WRITE),
    "cuty.payments.v1.PaymentService.GetPaymentTimeline": Load(SHEDDABLE, READ),
    "cuty.payments.v1.PaymentService.LookupPayment": Load(SHEDDABLE, READ),
    "cuty.payments.v1.PaymentService.IssueRefund": Load(NORMAL, PSP),
    "cuty.payments.v1.WebhookEndpointService.CreateWebhookEndpoint": Load(NORMAL, WRITE),
    "cuty.payments.v1.WebhookEndpointService.ListWebhookEndpoints": Load(SHEDDABLE, READ),
    "cuty.payments.v1.WebhookEndpointService.DeleteWebhookEndpoint": Load(NORMAL, WRITE),
    "cuty.payments.v1.WebhookEndpointService.ListWebhookDeliveries": Load(SHEDDABLE, READ),
    "cuty.payments.v1.WebhookEndpointService.RedeliverWebhook": Load(NORMAL, WRITE),
    # The PSP's word on a payment: a lost one costs a reconciliation round (or a buyer's wait).
    "cuty.payments.v1.PaymentService.HandlePspWebhook": Load(CRITICAL, WRITE),
}

# A route missing from LOAD (a unit test names it) is the first to be refused, with a read's deadline.
UNCLASSIFIED = Load(SHEDDABLE, READ)


def load_for(rpc: str) -> Load:
    return LOAD.get(rpc, UNCLASSIFIED)
