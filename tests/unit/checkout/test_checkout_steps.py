"""The saga's steps and the remote adapters with in-memory fakes (no database, no network): what
each step concludes from each kind of answer, the crash points around every remote call, and how
gRPC errors are sorted into retry / reject / compensate."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cutylib import crash, errors
from payments.checkout import domain as d
from payments.checkout.metrics import CheckoutMetrics
from payments.checkout.domain import Saga, Step
from payments.checkout.remote import BookingHolds, CodeReservations, Inventory, Refused, Rejected, Retryable
from payments.checkout.settings import CheckoutOptions
from payments.checkout.steps import Steps

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def rpc_error(code, message="boom", *details):
    st = status_pb2.Status(code=code.value[0], message=message)
    for det in details:
        a = any_pb2.Any()
        a.Pack(det)
        st.details.append(a)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(),
                                grpc.aio.Metadata(("grpc-status-details-bin", st.SerializeToString())), details=message)


def saga(state, kind=d.BOOKING, **kw) -> Saga:
    base = dict(id=str(uuid.uuid4()), customer_id="c", kind=kind, state=state, outcome=None, version=3,
                slot_id=str(uuid.uuid4()) if kind == d.BOOKING else None,
                product_id=None if kind == d.BOOKING else str(uuid.uuid4()), quantity=2 if kind == d.CODES else 1,
                hold_id="hold-1", order_id=None, amount_minor=5000, currency="TRY", expire_time=NOW + timedelta(60),
                extended=True, payment_key="k", payment_id="pay-1", payment_method="pm_card_ok", failure_reason="",
                attempts=0, lease_owner="me", created_at=NOW, updated_at=NOW, read_at=NOW)
    base.update(kw)
    return Saga(**base)


class Stub:
    """Answers (or raises) per method, records the requests."""

    def __init__(self, **answers):
        self.answers = answers
        self.requests: list[tuple[str, object]] = []

    def __getattr__(self, method):
        async def call(request, timeout=None):
            self.requests.append((method, request))
            answer = self.answers[method]
            if isinstance(answer, Exception):
                raise answer
            return answer
        return call


class Payments:
    """The saga's `ports.Payments`, answering what each test sets."""

    def __init__(self, **views):
        self.views = views
        self.calls: list[str] = []

    def _view(self, name):
        v = self.views[name]
        if isinstance(v, Exception):
            raise v
        return v

    async def create_and_charge(self, **kw):
        self.calls.append(f"charge {kw['idempotency_key']}")
        return self._view("charge")

    async def cancel(self, payment_id):
        self.calls.append("cancel")
        return self._view("cancel")

    async def refund(self, payment_id, key):
        self.calls.append(f"refund {key}")
        return self._view("refund")


def view(status):
    return SimpleNamespace(id="pay-1", status=status, terminal=status in d.P_TERMINAL)


def steps(booking=None, codepool=None, core=None) -> Steps:
    return Steps(Inventory(booking or Stub(), codepool or Stub()), core or Payments(), CheckoutMetrics(),
                 CheckoutOptions())


@pytest.fixture
def crashes(monkeypatch):
    seen = []
    monkeypatch.setattr(crash, "point", seen.append)
    return seen


async def test_hold_records_the_price_of_the_slot_and_its_expiry(crashes):
    hold = booking_pb2.Hold(id="h9", status=booking_pb2.HOLD_STATUS_HELD, merchant_id="salon-chain-1")
    hold.expire_time.FromDatetime(NOW)
    hold.price.currency_code, hold.price.amount_minor = "TRY", 75000
    booking = Stub(HoldSlot=hold)
    s = saga(d.PENDING, hold_id=None)
    out = await steps(booking).perform(Step.HOLD, s, None, None)
    assert out.move == d.Move(d.HELD) and out.learned.held.amount_minor == 75000 and out.learned.held.hold_id == "h9"
    assert out.learned.held.merchant_id == "salon-chain-1"  # the checkout records whose slot it is
    assert booking.requests[0][1].request_id == d.hold_request_id(s.id)  # the step's idempotency key
    assert crashes == ["hold:before", "hold:after"] and out.note.startswith("hold ")


async def test_slot_taken_rejects_with_the_alternatives():
    detail = booking_pb2.SlotUnavailable(slot_id="s", alternatives=[booking_pb2.Slot(id="alt")])
    booking = Stub(HoldSlot=rpc_error(grpc.StatusCode.ALREADY_EXISTS, "taken", detail))
    out = await steps(booking).perform(Step.HOLD, saga(d.PENDING), None, None)
    assert out.move.state == d.REJECTED and out.move.reason == "slot-unavailable"
    assert isinstance(out.raise_after, Rejected) and out.raise_after.error.detail.alternatives[0].id == "alt"


async def test_out_of_stock_rejects_with_the_available_count():
    codepool = Stub(ReserveCodes=rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "short",
                                           codepool_pb2.OutOfStock(available=1)))
    out = await steps(codepool=codepool).perform(Step.HOLD, saga(d.PENDING, kind=d.CODES), None, None)
    assert out.move.state == d.REJECTED and out.raise_after.error.detail.available == 1


@pytest.mark.parametrize("reason", ["too-many-active-reservations", "quantity-limit"])
async def test_a_customer_cap_is_refused_under_its_own_reason_not_out_of_stock(reason):
    codepool = Stub(ReserveCodes=rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "capped",
                                           error_details_pb2.ErrorInfo(reason=reason)))
    with pytest.raises(Refused) as e:
        await steps(codepool=codepool).perform(Step.HOLD, saga(d.PENDING, kind=d.CODES), None, None)
    assert isinstance(e.value.error, errors.ResourceExhausted) and e.value.error.reason == reason


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL])
async def test_no_definitive_answer_is_retried_never_assumed_failed(code):
    with pytest.raises(Retryable):
        await steps(Stub(ConfirmHold=rpc_error(code))).perform(Step.CONFIRM, saga(d.CONFIRMING), None, None)


async def test_unknown_slot_is_refused_as_bad_input():
    with pytest.raises(Refused) as e:
        await steps(Stub(HoldSlot=rpc_error(grpc.StatusCode.NOT_FOUND))).perform(Step.HOLD, saga(d.PENDING), None, None)
    assert isinstance(e.value.error, errors.NotFound)


async def test_confirm_refused_means_refund():
    out = await steps(Stub(ConfirmHold=rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "lost"))).perform(
        Step.CONFIRM, saga(d.CONFIRMING), None, None)
    assert out.move == d.Move(d.REFUNDING, reason="hold-lost")


async def test_deliver_refused_means_refund_and_confirm_carries_the_payment_id():
    codepool = Stub(DeliverCodes=codepool_pb2.Reservation())
    s = saga(d.CONFIRMING, kind=d.CODES)
    assert (await steps(codepool=codepool).perform(Step.CONFIRM, s, None, None)).move == d.Move(d.COMPLETED)
    assert codepool.requests[0][1].payment_transaction_id == "pay-1" and codepool.requests[0][1].order_id == s.id
    lost = Stub(DeliverCodes=rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "reservation-lost"))
    assert (await steps(codepool=lost).perform(Step.CONFIRM, s, None, None)).move.state == d.REFUNDING


async def test_release_of_a_confirmed_booking_is_never_reported_done():
    info = error_details_pb2.ErrorInfo(reason="hold-confirmed")
    booking = Stub(ReleaseHold=rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "confirmed", info))
    with pytest.raises(RuntimeError):
        await BookingHolds(booking).release(saga(d.RELEASING, outcome=d.EXPIRED))
    gone = Stub(ReleaseReservation=rpc_error(grpc.StatusCode.NOT_FOUND))
    await CodeReservations(gone).release(saga(d.RELEASING, kind=d.CODES, outcome=d.EXPIRED))  # nothing to give back


async def test_extension_of_an_expired_hold_gives_up_before_any_charge():
    expired = booking_pb2.Hold(id="h", status=booking_pb2.HOLD_STATUS_EXPIRED)
    booking = Stub(ExtendHold=rpc_error(grpc.StatusCode.FAILED_PRECONDITION), GetHold=expired)
    out = await steps(booking).perform(Step.EXTEND, saga(d.CHARGING, extended=False, payment_id=None), None, None)
    assert out.move == d.Move(d.RELEASING, d.EXPIRED, "hold-expired")


async def test_extension_is_learned_not_written():
    hold = booking_pb2.Hold(id="h", status=booking_pb2.HOLD_STATUS_HELD)
    hold.expire_time.FromDatetime(NOW + timedelta(minutes=10))
    out = await steps(Stub(ExtendHold=hold)).perform(Step.EXTEND, saga(d.CHARGING, extended=False), None, None)
    assert out.move is None and out.learned.extended and out.learned.expire_time == NOW + timedelta(minutes=10)


async def test_charge_uses_the_payment_attempt_key_and_a_refusal_fails_cleanly(crashes):
    s = saga(d.CHARGING, payment_id=None, payment_key=d.payment_attempt_id("x"))
    core = Payments(charge=view("succeeded"))
    out = await steps(core=core).perform(Step.CHARGE, s, None, None)
    assert out.learned.payment_id == "pay-1" and out.payment.status == "succeeded"
    assert core.calls == [f"charge {s.payment_key}"] and crashes == ["charge:before", "charge:after"]
    refused = Payments(charge=errors.InvalidArgument("amount", "must be positive"))
    out = await steps(core=refused).perform(Step.CHARGE, s, None, None)
    assert out.move == d.Move(d.RELEASING, d.FAILED, "payment-refused")


async def test_cancel_that_did_not_settle_is_retried():
    with pytest.raises(Retryable):
        await steps(core=Payments(cancel=view("processing"))).perform(
            Step.CANCEL_PAYMENT, saga(d.RELEASING, outcome=d.EXPIRED), None, "processing")


async def test_refund_then_release_with_the_refund_key(crashes):
    booking, core = Stub(ReleaseHold=booking_pb2.Hold()), Payments(refund=view("refunded"))
    s = saga(d.REFUNDING)
    out = await steps(booking, core=core).perform(Step.REFUND, s, None, "succeeded")
    assert out.move == d.Move(d.REFUNDED) and core.calls == [f"refund {d.refund_key(s.id)}"]
    assert [m for m, _ in booking.requests] == ["ReleaseHold"]
    assert crashes == ["refund:before", "refund:after", "release:before", "release:after"]
