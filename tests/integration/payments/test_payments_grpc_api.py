"""PaymentService over real gRPC in process: roles, bad input, what a client is told."""
import grpc
import pytest

from cuty.common.v1 import common_pb2
from cuty.payments.v1 import payments_pb2 as pb
from cutylib.grpc_errors import bad_field
from cutylib.testing.trust import user
from cutylib.testing.ids import new_id
from cutylib.testing.trust import TEST_MERCHANT

S = pb.PaymentStatus
CUSTOMER = user("cust-42", "customer")
STAFF = user("staff-1", "staff")


def create(method="pm_card_3ds", **kw) -> pb.CreatePaymentRequest:
    args = dict(checkout_id=new_id(), amount=common_pb2.Money(currency_code="TRY", amount_minor=4200),
                payment_method=method, idempotency_key=new_id(), customer_id="cust-42",
                merchant_id=TEST_MERCHANT)
    args.update(kw)
    return pb.CreatePaymentRequest(**args)


async def expect(code, call, field=None):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    assert e.value.code() == code, e.value.details()
    if field is not None:
        assert bad_field(e.value) == field
    return e.value


async def test_create_get_timeline_roundtrip(payments_server):
    p = await payments_server.CreatePayment(create())
    assert p.status == S.PAYMENT_STATUS_REQUIRES_ACTION and p.next_action.redirect_url and p.client_secret
    assert (p.amount.currency_code, p.amount.amount_minor, p.version) == ("TRY", 4200, 2)
    got = await payments_server.GetPayment(pb.GetPaymentRequest(payment_id=p.id), metadata=STAFF)
    assert got.id == p.id and got.client_secret == p.client_secret  # its merchant's staff may look
    t = await payments_server.GetPaymentTimeline(pb.GetPaymentTimelineRequest(payment_id=p.id), metadata=STAFF)
    assert [(e.source, e.from_status, e.to_status, e.version) for e in t.events] == [
        ("sync", "", "created", 1), ("sync", "created", "requires_action", 2)]
    assert all(e.create_time.seconds > 0 for e in t.events)
    c = await payments_server.CancelPayment(pb.CancelPaymentRequest(payment_id=p.id))
    assert c.status == S.PAYMENT_STATUS_CANCELED and not c.HasField("next_action") and not c.client_secret


@pytest.mark.parametrize("request_, field", [
    (create(amount=None), "amount"),
    (create(amount=common_pb2.Money(currency_code="TRY", amount_minor=0)), "amount.amount_minor"),
    (create(amount=common_pb2.Money(currency_code="", amount_minor=10)), "amount.currency_code"),
    (create(payment_method=""), "payment_method"),
    (create(idempotency_key=""), "idempotency_key"),
    (create(checkout_id="checkout-1"), "checkout_id"),
])
async def test_create_bad_input_names_the_field(payments_server, request_, field):
    await expect(grpc.StatusCode.INVALID_ARGUMENT, payments_server.CreatePayment(request_), field)


async def test_ids_and_roles(payments_server):
    stub = payments_server
    await expect(grpc.StatusCode.INVALID_ARGUMENT, stub.GetPayment(pb.GetPaymentRequest(payment_id="")), "payment_id")
    await expect(grpc.StatusCode.INVALID_ARGUMENT, stub.GetPayment(pb.GetPaymentRequest(payment_id="x")), "payment_id")
    await expect(grpc.StatusCode.NOT_FOUND, stub.GetPayment(pb.GetPaymentRequest(payment_id=new_id())))
    p = await stub.CreatePayment(create())
    stranger = user("staff-other", "staff", "merchant-other")
    await expect(grpc.StatusCode.NOT_FOUND, stub.GetPayment(pb.GetPaymentRequest(payment_id=p.id), metadata=stranger))
    # No route brings a customer to PaymentService: the role is refused before any handler.
    await expect(grpc.StatusCode.PERMISSION_DENIED, stub.GetPayment(pb.GetPaymentRequest(payment_id=p.id),
                                                                    metadata=CUSTOMER))
    await expect(grpc.StatusCode.PERMISSION_DENIED,
                 stub.GetPaymentTimeline(pb.GetPaymentTimelineRequest(payment_id=p.id), metadata=CUSTOMER))
    await expect(grpc.StatusCode.PERMISSION_DENIED, stub.CreatePayment(create(), metadata=CUSTOMER))
    await expect(grpc.StatusCode.PERMISSION_DENIED, stub.CreatePayment(create(), metadata=STAFF))
    await expect(grpc.StatusCode.PERMISSION_DENIED,
                 stub.CancelPayment(pb.CancelPaymentRequest(payment_id=p.id), metadata=CUSTOMER))
    await expect(grpc.StatusCode.PERMISSION_DENIED,
                 stub.RefundPayment(pb.RefundPaymentRequest(payment_id=p.id, idempotency_key="k"), metadata=CUSTOMER))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, stub.RefundPayment(pb.RefundPaymentRequest(payment_id=p.id)),
                 "idempotency_key")
    await expect(grpc.StatusCode.FAILED_PRECONDITION,
                 stub.RefundPayment(pb.RefundPaymentRequest(payment_id=p.id, idempotency_key=new_id())))


async def test_the_timeline_is_paged(payments_server):
    """Issue 10 item 4: every list is paged (page_size <= 500, stable order, opaque tokens)."""
    stub = payments_server
    p = await stub.CreatePayment(create())
    await stub.CancelPayment(pb.CancelPaymentRequest(payment_id=p.id))
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
