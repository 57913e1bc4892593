"""cuty.payments.v1.CheckoutService: proto <-> use case translation only (the use cases answer
values, checkout/answers.py; views.py builds the protos).

The customer is the caller's principal (metadata cuty-subject set by the gateway from the JWT),
never a request field; the Idempotency-Key arrives as metadata `idempotency-key`.
"""
from __future__ import annotations

import grpc
from grpc_status import rpc_status

from cuty.payments.v1 import checkout_pb2, checkout_pb2_grpc
from cutylib import errors, principal
from cutylib.timestamps import optional_instant
from cutylib.tls import GATEWAY, PAYMENTS

from .. import operator
from . import domain, live, views
from .idempotency import Replay
from .service import CheckoutService
from .staff_service import StaffBookings

IDEMPOTENCY_KEY = "idempotency-key"
# WatchCheckout: the SSE Last-Event-ID header, forwarded by the gateway (used when the request's
# after_event_id is 0), and the initial metadata telling the gateway the stream is open (so a
# refusal before it is an HTTP error, not an event stream).
LAST_EVENT_ID = "last-event-id"
STREAM_OPEN = ("cuty-stream", "open")
# Which service may call each RPC (its certificate's identity): checkouts are the gateway's; an
# operator's retry also comes from the payments service's own tooling.
CALLERS = {"CreateCheckout": {GATEWAY}, "PayCheckout": {GATEWAY}, "GetCheckout": {GATEWAY},
           "CancelCheckout": {GATEWAY}, "RescheduleCheckout": {GATEWAY}, "RetryCheckout": {GATEWAY, PAYMENTS}, "ListCheckouts": {GATEWAY},
           "WatchCheckout": {GATEWAY}, "CreateStaffCheckout": {GATEWAY}, "MarkPaidAtVenue": {GATEWAY},
           "MarkNoShow": {GATEWAY}}
# Where a caller other than the gateway acts as `system`: the operator's retry (the `ops` CLI).
SYSTEM_RPCS = frozenset({"RetryCheckout"})
# The user roles the gateway may bring: customers, and merchants' staff and admins, the operator.
USER_ROLES = frozenset({"customer", "staff", "admin", "operator"})
# Who may put a NEEDS_ATTENTION checkout back to work.
OPERATOR_ROLES = ("operator", "admin", "system")


def _key(context: grpc.aio.ServicerContext) -> str:
    return principal.metadata_value(context.invocation_metadata(), IDEMPOTENCY_KEY).strip()


async def _replay(context: grpc.aio.ServicerContext, replay: Replay) -> checkout_pb2.Checkout:
    """The first answer to this Idempotency-Key, unchanged (an error is replayed as the same status)."""
    if replay.is_error:
        await context.abort_with_status(rpc_status.to_status(replay.status()))
    return checkout_pb2.Checkout.FromString(replay.response)


async def _replay_with_current_action(service: CheckoutService, context: grpc.aio.ServicerContext,
                                      replay: Replay) -> checkout_pb2.Checkout:
    """A replayed PayCheckout (or one-call CreateCheckout): stored without the customer action
    (invariant 6), which is put back only while the payment, read now, still requires it. An
    answer without a payment is replayed as stored."""
    stored = await _replay(context, replay)
    if not stored.payment.id:
        return stored
    saga, payment = await service.current_payment(stored.id, stored.payment.id)
    return views.with_current_action(stored, saga, payment)


def _state(value: int) -> str | None:
    """The saga state named by a CheckoutState (None: unset, any state)."""
    if value == checkout_pb2.CHECKOUT_STATE_UNSPECIFIED:
        return None
    try:
        name = checkout_pb2.CheckoutState.Name(value)
    except ValueError:
        raise errors.InvalidArgument("state", f"state must be a CheckoutState, got {value}") from None
    return name.removeprefix(views.STATE_PREFIX)


class CheckoutApi(checkout_pb2_grpc.CheckoutServiceServicer):
    def __init__(self, service: CheckoutService):
        self.service = service

    async def CreateCheckout(self, request: checkout_pb2.CreateCheckoutRequest,
                             context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        customer = principal.current().require_subject()
        slot_id = request.slot_id
        if request.service_id or request.HasField("start_time") or request.resource_id:
            slot_id = await self.service.service_slot(request)
        req = domain.validate_create(slot_id, request.product_id, request.quantity,
                                     request.payment_method if request.HasField("payment_method") else None)
        try:
            fee = request.accept_no_show_fee if request.HasField("accept_no_show_fee") else None
            return views.checkout_pb(await self.service.create(customer, req, _key(context), fee))
        except Replay as r:
            return await _replay_with_current_action(self.service, context, r)

    async def PayCheckout(self, request: checkout_pb2.PayCheckoutRequest,
                          context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        customer = principal.current().require_subject()
        try:
            fee = request.accept_no_show_fee if request.HasField("accept_no_show_fee") else None
            return views.checkout_pb(await self.service.pay(customer, request.checkout_id, request.payment_method,
                                                            _key(context), fee))
        except Replay as r:
            return await _replay_with_current_action(self.service, context, r)

    async def GetCheckout(self, request: checkout_pb2.GetCheckoutRequest,
                          context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        caller = principal.current()
        if caller.role != "system":
            caller.require_subject()
        got = await self.service.get(caller, request.checkout_id)
        answer = views.checkout_pb(got)
        # Staff and admins of its merchant see the customer's no-shows there (the read was scoped).
        await self.service.staff.count_no_shows(caller, got.saga, answer)
        return answer

    async def CancelCheckout(self, request: checkout_pb2.CancelCheckoutRequest,
                             context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        caller = principal.current()
        if caller.role in ("staff", "admin"):
            # The merchant cancels a completed booking, full refund, with a reason.
            caller.require_subject()
            return views.checkout_pb(await self.service.cancel_by_staff(caller, request.checkout_id, request.reason))
        customer = caller.require_subject()
        return views.checkout_pb(await self.service.cancel(customer, request.checkout_id))

    async def RescheduleCheckout(self, request: checkout_pb2.RescheduleCheckoutRequest,
                                 context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        caller = principal.current()
        # The platform's operator looks, never changes a merchant's bookings.
        caller.require_role("customer", "staff", "admin")
        caller.require_subject()
        try:
            return views.checkout_pb(await self.service.reschedule(caller, request.checkout_id, request.slot_id,
                                                                   request.payment_method, _key(context)))
        except Replay as r:
            return await _replay(context, r)

    async def ListCheckouts(self, request: checkout_pb2.ListCheckoutsRequest,
                            context: grpc.aio.ServicerContext) -> checkout_pb2.ListCheckoutsResponse:
        caller = principal.current()
        caller.require_subject()
        after = optional_instant(request, "created_after")
        before = optional_instant(request, "created_before")
        filters = domain.list_filters(salon_id=request.salon_id, product_id=request.product_id,
                                      state=_state(request.state), created_after=after, created_before=before)
        return views.page_pb(await self.service.list(caller, filters, request.page_size, request.page_token))

    async def RetryCheckout(self, request: checkout_pb2.RetryCheckoutRequest,
                            context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        caller = principal.current()
        caller.require_role(*OPERATOR_ROLES)
        return views.checkout_pb(await self.service.retry(caller, operator.who(caller, context.invocation_metadata()),
                                                          request.checkout_id))

    async def WatchCheckout(self, request: checkout_pb2.WatchCheckoutRequest, context: grpc.aio.ServicerContext):
        caller = principal.current()
        caller.require_subject()
        after = request.after_event_id or _last_event_id(context)
        events = live.watch(self.service, self.service.watchers, caller, request.checkout_id, after)
        try:
            async for event in events:
                if event is None:
                    await context.send_initial_metadata((STREAM_OPEN,))
                    continue
                yield event
        finally:
            await events.aclose()


    # -- staff book for a customer (staff_service.py) ----------------------------------------------
    async def CreateStaffCheckout(self, request: checkout_pb2.CreateStaffCheckoutRequest,
                                  context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        try:
            return await self.service.staff.create(principal.current(), request, _key(context))
        except Replay as r:
            return StaffBookings.for_staff(await _replay(context, r))

    async def MarkPaidAtVenue(self, request: checkout_pb2.MarkPaidAtVenueRequest,
                              context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        return await self.service.staff.mark_paid(principal.current(), request)

    async def MarkNoShow(self, request: checkout_pb2.MarkNoShowRequest,
                         context: grpc.aio.ServicerContext) -> checkout_pb2.Checkout:
        return await self.service.staff.mark_no_show(principal.current(), request.checkout_id)


def _last_event_id(context: grpc.aio.ServicerContext) -> int:
    raw = principal.metadata_value(context.invocation_metadata(), LAST_EVENT_ID).strip()
    if not raw:
        return 0
    if not raw.isdigit() or len(raw) > 18:
        raise errors.InvalidArgument("Last-Event-ID", f"Last-Event-ID must be an event id (digits), got {raw[:40]!r}")
    return int(raw)
