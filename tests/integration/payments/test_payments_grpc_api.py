"""PaymentService over real gRPC in process: roles, bad input, what a client is told. Payments are
made as the saga makes them: through the core in process (checkout/ports.Payments), never over gRPC."""
import grpc
import pytest

from cuty.payments.v1 import payments_pb2 as pb
from cutylib.grpc_errors import bad_field
from cutylib.testing.trust import user
from cutylib.testing.ids import new_id
from cutylib.testing.trust import TEST_MERCHANT

S = pb.PaymentStatus
CUSTOMER = user("cust-42", "customer")
STAFF = user("staff-1", "staff")


async def charge(core, method="pm_card_3ds"):
    return await core.create_and_charge(checkout_id=new_id(), amount_minor=4200, currency="TRY", payment_method=method,
                                        idempotency_key=new_id(), customer_id="cust-42", merchant_id=TEST_MERCHANT)


async def expect(code, call, field=None):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    assert e.value.code() == code, e.value.details()
    if field is not None:
        assert bad_field(e.value) == field
    return e.value


async def test_a_payment_the_saga_made_has_its_timeline_for_staff(payments_server, core):
    p = (await charge(core)).to_proto()
    assert p.status == S.PAYMENT_STATUS_REQUIRES_ACTION and p.next_action.redirect_url and p.client_secret
    assert (p.amount.currency_code, p.amount.amount_minor, p.version) == ("TRY", 4200, 2)
    t = await payments_server.GetPaymentTimeline(pb.GetPaymentTimelineRequest(payment_id=p.id), metadata=STAFF)
    assert [(e.source, e.from_status, e.to_status, e.version) for e in t.events] == [
        ("sync", "", "created", 1), ("sync", "created", "requires_action", 2)]
    assert all(e.create_time.seconds > 0 for e in t.events)
    c = (await core.cancel(p.id)).to_proto()
    assert c.status == S.PAYMENT_STATUS_CANCELED and not c.HasField("next_action") and not c.client_secret
    t = await payments_server.GetPaymentTimeline(pb.GetPaymentTimelineRequest(payment_id=p.id), metadata=STAFF)
    assert t.events[-1].to_status == "canceled"


async def test_ids_and_roles(payments_server, core):
    stub = payments_server
    timeline = pb.GetPaymentTimelineRequest
    await expect(grpc.StatusCode.INVALID_ARGUMENT, stub.GetPaymentTimeline(timeline(payment_id=""), metadata=STAFF),
                 "payment_id")
    await expect(grpc.StatusCode.INVALID_ARGUMENT, stub.GetPaymentTimeline(timeline(payment_id="x"), metadata=STAFF),
                 "payment_id")
    await expect(grpc.StatusCode.NOT_FOUND, stub.GetPaymentTimeline(timeline(payment_id=new_id()), metadata=STAFF))
    p = await charge(core)
    stranger = user("staff-other", "staff", "merchant-other")
    await expect(grpc.StatusCode.NOT_FOUND, stub.GetPaymentTimeline(timeline(payment_id=p.id), metadata=stranger))
    # No route brings a customer to PaymentService: the role is refused before any handler.
    await expect(grpc.StatusCode.PERMISSION_DENIED, stub.GetPaymentTimeline(timeline(payment_id=p.id), metadata=CUSTOMER))
    await expect(grpc.StatusCode.PERMISSION_DENIED,
                 stub.RefundPayment(pb.RefundPaymentRequest(payment_id=p.id, idempotency_key="k"), metadata=CUSTOMER))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, stub.RefundPayment(pb.RefundPaymentRequest(payment_id=p.id)),
                 "idempotency_key")
    await expect(grpc.StatusCode.FAILED_PRECONDITION,
                 stub.RefundPayment(pb.RefundPaymentRequest(payment_id=p.id, idempotency_key=new_id())))


async def test_the_timeline_is_paged(payments_server, core):
    """Every list is paged (page_size <= 500, stable order, opaque tokens)."""
    stub = payments_server
    p = await charge(core)
    await core.cancel(p.id)
    first = await stub.GetPaymentTimeline(pb.GetPaymentTimelineRequest(payment_id=p.id, page_size=2), metadata=STAFF)
    assert [e.to_status for e in first.events] == ["created", "requires_action"] and first.next_page_token
    rest = await stub.GetPaymentTimeline(pb.GetPaymentTimelineRequest(
        payment_id=p.id, page_size=2, page_token=first.next_page_token), metadata=STAFF)
    assert [e.to_status for e in rest.events] == ["canceled"] and rest.next_page_token == ""
    whole = await stub.GetPaymentTimeline(pb.GetPaymentTimelineRequest(payment_id=p.id), metadata=STAFF)
    assert [e.seq for e in whole.events] == [e.seq for e in (*first.events, *rest.events)]
    for bad, field in ((pb.GetPaymentTimelineRequest(payment_id=p.id, page_token="not-ours"), "page_token"),
                       (pb.GetPaymentTimelineRequest(payment_id=p.id, page_size=-1), "page_size")):
        await expect(grpc.StatusCode.INVALID_ARGUMENT, stub.GetPaymentTimeline(bad, metadata=STAFF), field)
    full = await stub.GetPaymentTimeline(pb.GetPaymentTimelineRequest(payment_id=p.id, page_size=500), metadata=STAFF)
    assert len(full.events) == 3
    # The contract's page_size is 0..500 (payments.proto): more is refused, naming it.
    await expect(grpc.StatusCode.INVALID_ARGUMENT, stub.GetPaymentTimeline(
        pb.GetPaymentTimelineRequest(payment_id=p.id, page_size=10_000), metadata=STAFF), "page_size")
