"""`CutyClient`: the platform's public gRPC API for an internal service, over mutual TLS.

    tls = Tls(ca="ca.crt", cert="pos.crt", key="pos.key")
    async with CutyClient(tls, payments="payments:50053", booking="booking:50051",
                          codepool="codepool:50052") as cuty:
        checkout = await cuty.create_checkout(product_id=p, quantity=1, payment_method="pm_card_visa")
        mine = await cuty.for_user(token).list_checkouts()      # on behalf of a user (their token)

Every call has a deadline (the client's `deadline`, or the call's `deadline=`), and is tried again
on UNAVAILABLE or DEADLINE_EXCEEDED (`Retry`: bounded attempts, capped exponential backoff with
jitter, at least what the service asked in its RetryInfo) with the *same* idempotency key, so a
retried purchase is the one purchase. A write that takes no idempotency key is never retried.
Failures are `errors.CutyError` subclasses built from the services' status details.
"""
from __future__ import annotations

import asyncio
import pathlib
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from google.protobuf import timestamp_pb2

from . import errors
from ._pb.cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from ._pb.cuty.codepool.v1 import codepool_pb2, codepool_pb2_grpc
from ._pb.cuty.payments.v1 import checkout_pb2, checkout_pb2_grpc

IDEMPOTENCY_KEY = "idempotency-key"
AUTHORIZATION = "authorization"
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_HINT_SECONDS = 30.0


@dataclass(frozen=True)
class Tls:
    """This client's certificate and key (its identity, registered in the platform's
    CUTY_INTERNAL_CLIENTS) and the CA that signed the services' certificates."""
    ca: str | pathlib.Path
    cert: str | pathlib.Path
    key: str | pathlib.Path

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=pathlib.Path(self.ca).read_bytes(),
                                            private_key=pathlib.Path(self.key).read_bytes(),
                                            certificate_chain=pathlib.Path(self.cert).read_bytes())


@dataclass(frozen=True)
class Retry:
    """At most `attempts` tries of a call; before try n+1 a wait drawn from [step/2, step],
    step = min(cap, base * 2**(n-1)) (equal jitter), and never less than the service's RetryInfo."""
    attempts: int = 4
    base_seconds: float = 0.1
    cap_seconds: float = 2.0

    def __post_init__(self):
        if not 1 <= self.attempts <= 20:
            raise ValueError("Retry.attempts must be 1..20")

    def wait(self, failures: int, rng: random.Random | None = None) -> float:
        step = min(self.cap_seconds, self.base_seconds * 2 ** min(max(failures - 1, 0), 30))
        return step * (0.5 + 0.5 * (rng or random).random())


def _timestamp(value) -> timestamp_pb2.Timestamp | None:
    if value is None or isinstance(value, timestamp_pb2.Timestamp):
        return value
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)  # an aware datetime (the services refuse a time without offset)
    return ts


@dataclass
class _Channels:
    tls: Tls
    addresses: dict[str, str]
    server_names: dict[str, str]
    open: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def get(self, service: str) -> grpc.aio.Channel:
        ch = self.open.get(service)
        if ch is None:
            addr = self.addresses.get(service)
            if not addr:
                raise ValueError(f"no address for the {service} service: pass {service}='host:port'")
            ch = grpc.aio.secure_channel(addr, self.tls.credentials(), options=[
                # The services' certificates name the service (`payments`), whatever address is dialled.
                ("grpc.ssl_target_name_override", self.server_names.get(service, service)),
                ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
                ("grpc.keepalive_time_ms", 30_000), ("grpc.enable_retries", 0)])
            self.open[service] = ch
        return ch

    async def close(self) -> None:
        chans, self.open = list(self.open.values()), {}
        for ch in chans:
            await ch.close()


class CutyClient:
    """The public API of booking, the code pool and payments' checkouts, called as this client
    (mode "itself"), or, through `for_user(token)`, on behalf of the user whose token it forwards."""

    def __init__(self, tls: Tls, *, payments: str = "", booking: str = "", codepool: str = "",
                 deadline: float = 10.0, retry: Retry = Retry(), server_names: dict[str, str] | None = None,
                 _channels: _Channels | None = None, _token: str = ""):
        if deadline <= 0:
            raise ValueError("deadline must be positive (seconds)")
        self.deadline = deadline
        self.retry = retry
        self._channels = _channels or _Channels(tls, {"payments": payments, "booking": booking,
                                                      "codepool": codepool}, server_names or {})
        self._token = _token
        self._owner = _channels is None

    async def __aenter__(self) -> "CutyClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owner:
            await self._channels.close()

    def for_user(self, token: str) -> "CutyClient":
        """The same client acting for the user whose bearer token this is (the services verify it
        against the platform's identity provider); shares this client's connections."""
        if not token or any(c.isspace() for c in token):
            raise ValueError("a user's token is one non-empty word (the JWT, without 'Bearer')")
        return CutyClient(self._channels.tls, deadline=self.deadline, retry=self.retry,
                          _channels=self._channels, _token=token)

    # -- the one way every call goes ---------------------------------------------------------------
    async def call(self, service: str, stub_type, method: str, request, *, idempotency_key: str | None = None,
                   retry: bool = True, deadline: float | None = None):
        """`stub_type(channel).<method>(request)` with this client's deadline, retries, user token
        and `idempotency_key` (sent as metadata); a failure as a typed `errors.CutyError`.
        `retry=False`: one try only (a write without an idempotency key)."""
        metadata, timeout = self._metadata(idempotency_key), self._timeout(deadline)
        fn = getattr(stub_type(self._channels.get(service)), method)
        attempts = self.retry.attempts if retry else 1
        for attempt in range(1, attempts + 1):
            try:
                return await fn(request, timeout=timeout, metadata=metadata)
            except grpc.aio.AioRpcError as e:
                err = errors.from_rpc_error(e, rpc=f"{service}.{method}")
                if e.code() not in RETRYABLE or attempt == attempts:
                    raise err from None
                # The service's RetryInfo is honoured, within bounds (a hint, not a reason to hang).
                await asyncio.sleep(max(self.retry.wait(attempt), min(err.retry_after or 0.0, MAX_HINT_SECONDS)))
        raise AssertionError("unreachable")

    def _metadata(self, idempotency_key: str | None) -> tuple[tuple[str, str], ...]:
        metadata = []
        if idempotency_key is not None:
            metadata.append((IDEMPOTENCY_KEY, idempotency_key))
        if self._token:
            metadata.append((AUTHORIZATION, f"Bearer {self._token}"))
        return tuple(metadata)

    def _timeout(self, deadline: float | None) -> float:
        timeout = self.deadline if deadline is None else deadline
        if timeout <= 0:
            raise ValueError("deadline must be positive (seconds)")
        return timeout

    @staticmethod
    def new_key() -> str:
        return str(uuid.uuid4())

    # -- payments: checkouts -----------------------------------------------------------------------
    async def create_checkout(self, *, slot_id: str = "", product_id: str = "", quantity: int = 0,
                              service_id: str = "", start_time=None, resource_id: str = "",
                              payment_method: str | None = None, idempotency_key: str | None = None,
                              deadline: float | None = None) -> checkout_pb2.Checkout:
        """A checkout of a slot (`slot_id`, or a service's free time: `service_id` + `start_time`)
        or of codes (`product_id`, `quantity`); with `payment_method` it is paid in the same call.
        Raises SlotTaken (with alternatives) or OutOfStock when the thing is gone."""
        req = checkout_pb2.CreateCheckoutRequest(slot_id=slot_id, product_id=product_id, quantity=quantity,
                                                 service_id=service_id, resource_id=resource_id)
        if start_time is not None:
            req.start_time.CopyFrom(_timestamp(start_time))
        if payment_method is not None:
            req.payment_method = payment_method
        return await self.call("payments", checkout_pb2_grpc.CheckoutServiceStub, "CreateCheckout", req,
                               idempotency_key=idempotency_key or self.new_key(), deadline=deadline)

    async def pay_checkout(self, checkout_id: str, payment_method: str, *, idempotency_key: str | None = None,
                           deadline: float | None = None) -> checkout_pb2.Checkout:
        req = checkout_pb2.PayCheckoutRequest(checkout_id=checkout_id, payment_method=payment_method)
        return await self.call("payments", checkout_pb2_grpc.CheckoutServiceStub, "PayCheckout", req,
                               idempotency_key=idempotency_key or self.new_key(), deadline=deadline)

    async def get_checkout(self, checkout_id: str, *, deadline: float | None = None) -> checkout_pb2.Checkout:
        return await self.call("payments", checkout_pb2_grpc.CheckoutServiceStub, "GetCheckout",
                               checkout_pb2.GetCheckoutRequest(checkout_id=checkout_id), deadline=deadline)

    async def cancel_checkout(self, checkout_id: str, *, reason: str = "",
                              deadline: float | None = None) -> checkout_pb2.Checkout:
        # Takes no idempotency key: tried once (a cancel that timed out is read back with get_checkout).
        return await self.call("payments", checkout_pb2_grpc.CheckoutServiceStub, "CancelCheckout",
                               checkout_pb2.CancelCheckoutRequest(checkout_id=checkout_id, reason=reason),
                               retry=False, deadline=deadline)

    async def watch_checkout(self, checkout_id: str, *, after_event_id: int = 0,
                             deadline: float | None = None) -> AsyncIterator[checkout_pb2.CheckoutEvent]:
        """The checkout's events as they happen, after `after_event_id`, until the deadline (the
        stream ends then; open it again with the last event's id). For a user, the deadline must
        not outlast their token (the service refuses such a stream). Not retried."""
        stub = checkout_pb2_grpc.CheckoutServiceStub(self._channels.get("payments"))
        call = stub.WatchCheckout(checkout_pb2.WatchCheckoutRequest(checkout_id=checkout_id,
                                                                    after_event_id=after_event_id),
                                  timeout=self._timeout(deadline), metadata=self._metadata(None))
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e, rpc="payments.WatchCheckout") from None
        finally:
            call.cancel()

    async def list_checkouts(self, *, page_size: int = 50, page_token: str = "",
                             deadline: float | None = None) -> checkout_pb2.ListCheckoutsResponse:
        req = checkout_pb2.ListCheckoutsRequest(page_size=page_size, page_token=page_token)
        return await self.call("payments", checkout_pb2_grpc.CheckoutServiceStub, "ListCheckouts", req,
                               deadline=deadline)

    # -- booking: public reads ---------------------------------------------------------------------
    async def list_slots(self, salon_id: str, start_time, end_time, *, available_only: bool = False,
                         page_size: int = 100, page_token: str = "",
                         deadline: float | None = None) -> booking_pb2.ListSlotsResponse:
        """A salon's slots starting in [start_time, end_time) (aware datetimes or Timestamps)."""
        req = booking_pb2.ListSlotsRequest(salon_id=salon_id, start_time=_timestamp(start_time),
                                           end_time=_timestamp(end_time), available_only=available_only,
                                           page_size=page_size, page_token=page_token)
        return await self.call("booking", booking_pb2_grpc.BookingServiceStub, "ListSlots", req, deadline=deadline)

    # -- code pool: public reads -------------------------------------------------------------------
    async def get_stock(self, product_id: str, *, deadline: float | None = None) -> codepool_pb2.Stock:
        return await self.call("codepool", codepool_pb2_grpc.CodePoolServiceStub, "GetStock",
                               codepool_pb2.GetStockRequest(product_id=product_id), deadline=deadline)
