"""Issue 12, item 3: the merchant's refunds, full or partial, in process (real PostgreSQL, real saga
and payments core, fake booking / code pool / PSP): never more than captured in total (decided by
the database, also under real concurrency), idempotent per (merchant, payment, key), in the payment
timeline with amount, reason and who, the saga's full refund refunding only the rest, a PSP timeout
or a crash around the PSP call finished by a retry with the same key (or reconciliation) without
refunding twice, and the rule for delivered codes."""
from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
import pytest_asyncio

from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2 as pb, payments_pb2, payments_pb2_grpc
from cutylib.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from cutylib.grpc_errors import error_reason
from cutylib.grpc_server import GrpcServer
from cutylib.testing.trust import TEST_MERCHANT, acting_channel, user
from payments import ops
from cutylib import crash
from payments.checkout import domain as checkout_domain
from payments.checkout.domain import validate_create
from payments.grpc_api import CALLERS as PAYMENT_CALLERS, SYSTEM_RPCS as PAYMENT_SYSTEM_RPCS, \
    USER_ROLES as PAYMENT_USER_ROLES, PaymentApi

C = "customer-" + uuid.uuid4().hex[:8]
WHO = "staff:staff-7"


async def booked(h, price: int = 10_000) -> str:
    """A COMPLETED booking's payment id (captured `price`)."""
    created = await h.service.create(C, validate_create(h.booking.add_slot(price=price), "", 0), "")
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    return paid.payment.id


async def refund(h, payment_id: str, amount: int | None, key: str | None = None, reason: str = "late stylist", *,
                 codes_ok: bool = False, merchant: str = TEST_MERCHANT):
    return await h.core.issue_refund(merchant, payment_id, key or uuid.uuid4().hex, amount_minor=amount,
                                     currency=None, reason=reason, actor=WHO, codes_delivered_ok=codes_ok)


async def totals(h, payment_id: str):
    return await h.pool.fetchrow("SELECT status, amount_minor, refunded_minor, refund_settled_minor, version "
                                 "FROM payments WHERE id = $1", uuid.UUID(payment_id))


async def refunds_of(h, payment_id: str):
    return await h.pool.fetch("SELECT * FROM refunds WHERE payment_id = $1 ORDER BY created_at", uuid.UUID(payment_id))


def psp_refunded(h, payment_id_intent: str) -> int:
    return h.psp.refunded(payment_id_intent)


async def test_a_partial_refund_then_the_rest(harness):
    h = harness
    pid = await booked(h)
    first = await refund(h, pid, 2_500, reason="stylist was late")
    assert (first.status, first.amount_minor, first.requested_by) == ("succeeded", 2_500, WHO)
    view = await h.core.get(pid)
    assert (view.status, view.refund_settled_minor) == ("partially_refunded", 2_500)
    assert view.to_proto().status == payments_pb2.PAYMENT_STATUS_PARTIALLY_REFUNDED
    assert view.to_proto().refunded.amount_minor == 2_500
    rest = await refund(h, pid, None, reason="customer unhappy")
    assert rest.amount_minor == 7_500 and rest.requested_minor is None
    t = await totals(h, pid)
    assert (t["status"], t["refunded_minor"], t["refund_settled_minor"]) == ("refunded", 10_000, 10_000)
    assert psp_refunded(h, view.psp_intent_id) == 10_000 and len(h.psp.refunds) == 2
    # Each refund in the timeline: amount, reason and who, with the status change it caused.
    events = [(e.from_status, e.to_status, e.note) for e in await h.core.timeline(pid)]
    settled = [e for e in events if "succeeded at the PSP" in e[2]]
    assert [(f, t) for f, t, _ in settled] == [("succeeded", "partially_refunded"), ("partially_refunded", "refunded")]
    assert "2500 TRY" in settled[0][2] and WHO in settled[0][2] and "stylist was late" in settled[0][2]
    assert "7500 TRY" in settled[1][2] and "customer unhappy" in settled[1][2]
    assert any(n.startswith(f"refund requested by {WHO}: stylist was late") for _, _, n in events)
    # Nothing is left: the next refund is refused, whatever it asks.
    for amount in (None, 1):
        with pytest.raises(FailedPrecondition) as e:
            await refund(h, pid, amount)
        assert e.value.reason == "payment-not-refundable"


async def test_an_over_refund_is_refused_and_changes_nothing(harness):
    h = harness
    pid = await booked(h)
    await refund(h, pid, 6_000)
    before = await totals(h, pid)
    with pytest.raises(FailedPrecondition) as e:
        await refund(h, pid, 4_001)
    assert e.value.reason == "refund-exceeds-captured" and "4000" in str(e.value)
    assert await totals(h, pid) == before and len(h.psp.refunds) == 1
    with pytest.raises(InvalidArgument) as e:
        await h.core.issue_refund(TEST_MERCHANT, pid, "k-eur", amount_minor=1, currency="EUR", reason="x",
                                  actor=WHO, codes_delivered_ok=False)
    assert e.value.field == "amount.currency_code"
    # The database refuses it too, whatever code would try.
    import asyncpg
    with pytest.raises(asyncpg.CheckViolationError, match="payments_refunds_within_capture"):
        await h.pool.execute("UPDATE payments SET refunded_minor = amount_minor + 1 WHERE id = $1", uuid.UUID(pid))


async def test_only_a_captured_payment_is_refunded(harness):
    h = harness
    created = await h.service.create(C, validate_create(h.booking.add_slot(price=900), "", 0), "")
    paid = await h.service.pay(C, created.id, "pm_card_declined", "")
    with pytest.raises(FailedPrecondition) as e:
        await refund(h, paid.payment.id, None)
    assert e.value.reason == "payment-not-refundable"
    assert await refunds_of(h, paid.payment.id) == []


async def test_concurrent_refunds_racing_for_the_last_amount(harness):
    """10 000 captured, 6 000 refunded; 12 refunds of 1 000 race (each on its own connection, from
    several cores): exactly 4 fit, and the database agrees with the PSP afterwards."""
    h = harness
    pid = await booked(h)
    await refund(h, pid, 6_000)
    cores = [h.new_core(f"racer-{i}") for i in range(4)]

    async def one(i: int):
        core = cores[i % len(cores)]
        try:
            return await core.issue_refund(TEST_MERCHANT, pid, f"race-{i}", amount_minor=1_000, currency=None,
                                           reason="race", actor=WHO, codes_delivered_ok=False)
        except FailedPrecondition as exc:
            return exc.reason

    results = await asyncio.gather(*(one(i) for i in range(12)))
    won = [r for r in results if not isinstance(r, str)]
    assert len(won) == 4 and all(r.status == "succeeded" for r in won)
    assert set(r for r in results if isinstance(r, str)) <= {"refund-exceeds-captured", "payment-not-refundable"}
    t = await totals(h, pid)
    assert (t["status"], t["refunded_minor"], t["refund_settled_minor"]) == ("refunded", 10_000, 10_000)
    rows = await refunds_of(h, pid)
    assert sum(r["amount_minor"] for r in rows if r["status"] == "succeeded") == 10_000
    assert all(r["status"] == "succeeded" for r in rows) and len(rows) == 5
    assert psp_refunded(h, (await h.core.get(pid)).psp_intent_id) == 10_000


async def test_concurrent_refunds_of_the_rest_only_one_wins(harness):
    h = harness
    pid = await booked(h)
    results = await asyncio.gather(*(refund(h, pid, None, key=f"rest-{i}") for i in range(6)),
                                   return_exceptions=True)
    won = [r for r in results if not isinstance(r, Exception)]
    assert len(won) == 1 and won[0].amount_minor == 10_000
    assert all(isinstance(r, FailedPrecondition) for r in results if isinstance(r, Exception))
    assert (await totals(h, pid))["refunded_minor"] == 10_000 and len(h.psp.refunds) == 1


async def test_a_replay_answers_the_same_refund_and_a_reused_key_is_refused(harness):
    h = harness
    pid = await booked(h)
    first = await refund(h, pid, 1_000, key="k-1", reason="broken dryer")
    again = await refund(h, pid, 1_000, key="k-1", reason="broken dryer")
    assert again.id == first.id and again.status == "succeeded" and len(h.psp.refunds) == 1
    # Concurrent replays too: one refund.
    replays = await asyncio.gather(*(refund(h, pid, 1_000, key="k-1", reason="broken dryer") for _ in range(5)))
    assert {r.id for r in replays} == {first.id}
    assert (await totals(h, pid))["refunded_minor"] == 1_000
    for amount, reason in ((2_000, "broken dryer"), (1_000, "another reason"), (None, "broken dryer")):
        with pytest.raises(FailedPrecondition) as e:
            await refund(h, pid, amount, key="k-1", reason=reason)
        assert e.value.reason == "idempotency-key-reused"
    # The key is the merchant's, per payment: the same key on another payment is another refund.
    other = await booked(h)
    assert (await refund(h, other, 1_000, key="k-1", reason="broken dryer")).id != first.id


async def test_another_merchants_payment_is_not_found(harness):
    h = harness
    pid = await booked(h)
    with pytest.raises(NotFound):
        await refund(h, pid, 100, merchant="merchant-else")
    assert await refunds_of(h, pid) == []


async def test_the_sagas_full_refund_after_a_partial_staff_refund_refunds_the_rest(harness):
    h = harness
    pid = await booked(h)
    checkout_id = await h.pool.fetchval("SELECT checkout_id FROM payments WHERE id = $1", uuid.UUID(pid))
    await refund(h, pid, 3_000)
    # What the saga's refund step calls (and `ops refund`, through RefundPayment): the rest only.
    view = await h.core.refund(pid, checkout_domain.refund_key(checkout_id))
    assert view.status == "refunded" and view.refund_settled_minor == 10_000
    rows = await refunds_of(h, pid)
    assert [(r["amount_minor"], r["requested_by"]) for r in rows] == [(3_000, WHO), (7_000, "system")]
    assert psp_refunded(h, view.psp_intent_id) == 10_000
    # Again (a retried saga step): nothing more.
    again = await h.core.refund(pid, checkout_domain.refund_key(checkout_id))
    assert again.version == view.version and len(h.psp.refunds) == 2
    # Staff refunded everything already: the saga's refund has nothing to do.
    pid2 = await booked(h)
    await refund(h, pid2, None)
    v2 = await h.core.refund(pid2, "saga-key")
    assert v2.status == "refunded" and len(await refunds_of(h, pid2)) == 1


async def test_a_psp_timeout_leaves_the_refund_pending_and_a_retry_finishes_it_once(harness):
    h = harness
    pid = await booked(h)
    h.psp.unavailable["refund"] = 1  # no answer, nothing refunded
    with pytest.raises(Unavailable):
        await refund(h, pid, 4_000, key="t-1")
    (row,) = await refunds_of(h, pid)
    assert row["status"] == "pending"
    t = await totals(h, pid)
    assert (t["status"], t["refunded_minor"], t["refund_settled_minor"]) == ("succeeded", 4_000, 0)
    # The pending amount counts: a refund that would pass the capture with it is refused meanwhile.
    with pytest.raises(FailedPrecondition):
        await refund(h, pid, 6_001)
    h.psp.unavailable["refund-answer"] = 1  # this time the PSP refunds, but the answer is lost
    with pytest.raises(Unavailable):
        await refund(h, pid, 4_000, key="t-1")
    done = await refund(h, pid, 4_000, key="t-1")
    assert done.id == str(row["id"]) and done.status == "succeeded"
    intent = (await h.core.get(pid)).psp_intent_id
    assert psp_refunded(h, intent) == 4_000 and len(h.psp.refunds) == 1
    t = await totals(h, pid)
    assert (t["status"], t["refunded_minor"], t["refund_settled_minor"]) == ("partially_refunded", 4_000, 4_000)


async def test_reconciliation_finishes_a_pending_refund(harness):
    h = harness
    pid = await booked(h)
    h.psp.unavailable["refund-answer"] = 1
    with pytest.raises(Unavailable):
        await refund(h, pid, None, key="r-1")
    assert await h.core.finish_pending_refunds(older_than_seconds=3600) == 0  # not due yet
    assert await h.core.finish_pending_refunds(older_than_seconds=0) >= 1
    (row,) = await refunds_of(h, pid)
    assert row["status"] == "succeeded"
    assert (await totals(h, pid))["status"] == "refunded" and len(h.psp.refunds) == 1
    events = [e for e in await h.core.timeline(pid) if "succeeded at the PSP" in e.note]
    assert [e.source for e in events] == ["reconcile"]


async def test_a_refund_the_psp_refuses_gives_its_amount_back(harness):
    h = harness
    pid = await booked(h)
    h.psp.refusing["refund"] = 1
    with pytest.raises(FailedPrecondition) as e:
        await refund(h, pid, 5_000, key="f-1")
    assert e.value.reason == "psp-refused"
    t = await totals(h, pid)
    assert (t["status"], t["refunded_minor"]) == ("succeeded", 0)
    with pytest.raises(FailedPrecondition) as e:  # the same key answers the same refusal
        await refund(h, pid, 5_000, key="f-1")
    assert e.value.reason == "psp-refused"
    assert (await refund(h, pid, None, key="f-2")).amount_minor == 10_000


@pytest.mark.parametrize("point", ["psp_refund:before", "psp_refund:after"])
async def test_a_crash_around_the_psp_call_is_finished_by_the_retry_without_a_double_refund(harness, monkeypatch,
                                                                                            point):
    """The process dies between the database write and the PSP call (or between the PSP's answer
    and its record): the refund stays pending with its amount counted; the retry with the same key
    asks the PSP with the same Idempotency-Key (the refund id), so the money goes back once. (The
    real SIGKILL at these points is CUTY_CRASH_AT=psp_refund:before / psp_refund:after.)"""
    h = harness
    pid = await booked(h)

    class Died(BaseException):
        pass

    def die(name: str) -> None:
        if name == point:
            raise Died(name)

    monkeypatch.setattr(crash, "point", die)
    with pytest.raises(Died):
        await refund(h, pid, 2_000, key="c-1")
    (row,) = await refunds_of(h, pid)
    assert row["status"] == "pending"
    assert len(h.psp.refunds) == (1 if point == "psp_refund:after" else 0)
    monkeypatch.undo()
    done = await refund(h, pid, 2_000, key="c-1")
    assert done.status == "succeeded" and len(h.psp.refunds) == 1
    assert psp_refunded(h, (await h.core.get(pid)).psp_intent_id) == 2_000
    t = await totals(h, pid)
    assert (t["status"], t["refunded_minor"], t["refund_settled_minor"]) == ("partially_refunded", 2_000, 2_000)


# -- through the gRPC API (roles, merchants, delivered codes) --------------------------------------

@pytest_asyncio.fixture
async def api(harness):
    server = GrpcServer("payments", 0, host="127.0.0.1")
    payments_pb2_grpc.add_PaymentServiceServicer_to_server(PaymentApi(harness.core, None), server.server)
    server.add_service(payments_pb2.DESCRIPTOR.services_by_name["PaymentService"], PAYMENT_CALLERS,
                       system=PAYMENT_SYSTEM_RPCS, roles=PAYMENT_USER_ROLES)
    await server.start()
    harness.addr = f"127.0.0.1:{server.port}"
    channel = acting_channel(harness.addr, "payments", PAYMENT_CALLERS)
    yield payments_pb2_grpc.PaymentServiceStub(channel)
    await channel.close()
    await server.stop()


def ask(payment_id: str, amount: int | None, reason: str = "goodwill") -> payments_pb2.IssueRefundRequest:
    req = payments_pb2.IssueRefundRequest(payment_id=payment_id, reason=reason)
    if amount is not None:
        req.amount.CopyFrom(common_pb2.Money(currency_code="TRY", amount_minor=amount))
    return req


def as_(role: str, org: str | None = None, key: str | None = None):
    return user(f"{role}-1", role, org) + (("idempotency-key", key or uuid.uuid4().hex),)


async def test_staff_refund_through_the_api_and_who_may(harness, api):
    h = harness
    pid = await booked(h)
    r = await api.IssueRefund(ask(pid, 1_500), metadata=as_("staff"))
    assert r.status == payments_pb2.REFUND_STATUS_SUCCEEDED and r.amount.amount_minor == 1_500
    assert r.requested_by == "staff:staff-1" and r.payment.status == payments_pb2.PAYMENT_STATUS_PARTIALLY_REFUNDED
    assert r.payment.refunded.amount_minor == 1_500 and not r.payment.client_secret
    r2 = await api.IssueRefund(ask(pid, None), metadata=as_("admin"))
    assert r2.amount.amount_minor == 8_500 and r2.payment.status == payments_pb2.PAYMENT_STATUS_REFUNDED
    pid = await booked(h)
    for md, code in ((as_("staff", "merchant-else"), grpc.StatusCode.NOT_FOUND),
                     (as_("admin", "merchant-else"), grpc.StatusCode.NOT_FOUND),
                     (as_("operator"), grpc.StatusCode.PERMISSION_DENIED),
                     (as_("customer"), grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await api.IssueRefund(ask(pid, 100), metadata=md)
        assert e.value.code() == code, md
    bad = [(ask(pid, 100, reason=""), "reason"), (ask(pid, 100, reason="x" * 501), "reason"),
           (ask(pid, 100, reason="a\nb"), "reason"), (ask(pid, 0), "amount.amount_minor")]
    for req, field in bad:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await api.IssueRefund(req, metadata=as_("staff"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
    with pytest.raises(grpc.aio.AioRpcError) as e:  # no Idempotency-Key
        await api.IssueRefund(ask(pid, 100), metadata=user("staff-1", "staff"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.IssueRefund(ask(pid, 10_001), metadata=as_("staff"))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and error_reason(e.value) == "refund-exceeds-captured"
    assert await refunds_of(h, pid) == []
    # Replay and reuse through the API: the same key answers the same refund.
    a = await api.IssueRefund(ask(pid, 100), metadata=as_("staff", key="api-k"))
    b = await api.IssueRefund(ask(pid, 100), metadata=as_("staff", key="api-k"))
    assert a.id == b.id
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.IssueRefund(ask(pid, 200), metadata=as_("staff", key="api-k"))
    assert error_reason(e.value) == "idempotency-key-reused"


async def test_delivered_codes_are_refunded_only_by_the_admin_naming_the_amount(harness, api):
    h = harness
    product = h.codepool.add_product(price=2_500, stock=5)
    created = await h.service.create(C, validate_create("", product, 2), "")
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED  # the codes are in the buyer's checkout
    pid = paid.payment.id
    for md, req in ((as_("staff"), ask(pid, 2_500)), (as_("staff"), ask(pid, None)), (as_("admin"), ask(pid, None))):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await api.IssueRefund(req, metadata=md)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and error_reason(e.value) == "codes-delivered"
    r = await api.IssueRefund(ask(pid, 2_500, reason="a code did not work"), metadata=as_("admin"))
    assert r.status == payments_pb2.REFUND_STATUS_SUCCEEDED
    assert r.payment.status == payments_pb2.PAYMENT_STATUS_PARTIALLY_REFUNDED


async def test_ops_refund_of_a_partly_refunded_purchase_refunds_the_rest(harness, api):
    h = harness
    pid = await booked(h)
    await api.IssueRefund(ask(pid, 4_000), metadata=as_("staff"))
    _, p = await ops.refund(h.addr, h.pool, pid, "bob", "customer called", True)
    assert p.status == payments_pb2.PAYMENT_STATUS_REFUNDED and p.refunded.amount_minor == 10_000
    assert [r["requested_by"] for r in await refunds_of(h, pid)] == ["staff:staff-1", "ops:bob"]
    assert psp_refunded(h, p.psp_intent_id) == 10_000
