"""Merchants as tenants in the payments service: a checkout and its payment belong to the merchant of what was
bought; staff and admins see and retry only their merchant's, the operator sees every merchant's
and is audited, and the database refuses to move a row or to show it to another merchant."""
from __future__ import annotations

import uuid

import asyncpg
import grpc
import pytest

from cuty.payments.v1 import checkout_pb2 as pb, checkout_pb2_grpc, payments_pb2, payments_pb2_grpc
from cutylib.testing.postgres import owner_connection
from cutylib.testing.tenancy import probe_role, rows_seen, tenant_tables
from cutylib.testing.trust import TEST_MERCHANT, channel_as, user

OTHER = "merchant-other-" + uuid.uuid4().hex[:6]


def stubs(h):
    ch = channel_as("gateway", h.addr, "payments")
    return checkout_pb2_grpc.CheckoutServiceStub(ch), payments_pb2_grpc.PaymentServiceStub(ch)


async def code_of(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


async def test_the_checkout_and_its_payment_carry_the_merchant_of_the_slot(served):
    h, checkout_id, payment_id = served
    row = await h.row(checkout_id)
    assert row["merchant_id"] == TEST_MERCHANT
    assert await h.pool.fetchval("SELECT merchant_id FROM payments WHERE id = $1", uuid.UUID(payment_id)) == TEST_MERCHANT
    # every event of the payment, and the saga's from the hold on, name the merchant
    events = await h.pool.fetch("SELECT to_status, merchant_id FROM payment_events WHERE checkout_id = $1 ORDER BY seq",
                                uuid.UUID(checkout_id))
    assert events and all(e["merchant_id"] == TEST_MERCHANT for e in events)
    checkouts, payments = stubs(h)
    got = await checkouts.GetCheckout(pb.GetCheckoutRequest(checkout_id=checkout_id), metadata=user("s-1", "staff"))
    assert got.merchant_id == TEST_MERCHANT


async def test_another_merchants_staff_and_admins_find_nothing(served):
    h, checkout_id, payment_id = served
    checkouts, payments = stubs(h)
    intent = (await h.core.get(payment_id)).psp_intent_id
    reads = {
        "GetCheckout": lambda md: checkouts.GetCheckout(pb.GetCheckoutRequest(checkout_id=checkout_id), metadata=md),
        "GetPaymentTimeline": lambda md: payments.GetPaymentTimeline(
            payments_pb2.GetPaymentTimelineRequest(payment_id=payment_id), metadata=md),
        "LookupPayment": lambda md: payments.LookupPayment(
            payments_pb2.LookupPaymentRequest(psp_intent_id=intent), metadata=md),
        "RetryCheckout": lambda md: checkouts.RetryCheckout(pb.RetryCheckoutRequest(checkout_id=checkout_id),
                                                            metadata=md),
    }
    for name, call in reads.items():
        for role in ("staff", "admin"):
            if name == "RetryCheckout" and role == "staff":
                continue
            assert await code_of(call(user("x-1", role, OTHER))) == grpc.StatusCode.NOT_FOUND, (name, role)
            # no merchant at all: refused, whatever the gateway let through
            assert await code_of(call(user("x-1", role, ""))) == grpc.StatusCode.UNAUTHENTICATED, (name, role)
    assert (await h.row(checkout_id))["state"] == "NEEDS_ATTENTION"  # the other admin's retry changed nothing
    # the merchant's own staff read all of it
    for name in ("GetCheckout", "GetPaymentTimeline", "LookupPayment"):
        assert await code_of(reads[name](user("s-1", "staff"))) == grpc.StatusCode.OK, name


async def test_the_operator_reads_every_merchant_and_each_read_is_audited(served):
    h, checkout_id, payment_id = served
    checkouts, payments = stubs(h)
    before = await h.pool.fetchval("SELECT count(*) FROM operator_reads WHERE subject = 'op-7'")
    operator = user("op-7", "operator")
    got = await checkouts.GetCheckout(pb.GetCheckoutRequest(checkout_id=checkout_id), metadata=operator)
    assert got.merchant_id == TEST_MERCHANT and got.HasField("diagnostics")
    await payments.GetPaymentTimeline(payments_pb2.GetPaymentTimelineRequest(payment_id=payment_id), metadata=operator)
    audited = await h.pool.fetch("SELECT rpc, object_id, of_merchant, trace_id FROM operator_reads "
                                 "WHERE subject = 'op-7' ORDER BY id")
    assert len(audited) == before + 2
    assert [(a["rpc"], a["object_id"]) for a in audited[-2:]] == [("GetCheckout", checkout_id),
                                                                  ("GetPaymentTimeline", payment_id)]
    assert audited[-2]["of_merchant"] == TEST_MERCHANT
    with pytest.raises(asyncpg.PostgresError):  # the audit is append-only
        await h.pool.execute("DELETE FROM operator_reads WHERE subject = 'op-7'")
    # a staff read is the merchant's own business: not in the operator's audit
    await checkouts.GetCheckout(pb.GetCheckoutRequest(checkout_id=checkout_id), metadata=user("s-1", "staff"))
    assert await h.pool.fetchval("SELECT count(*) FROM operator_reads WHERE subject = 's-1'") == 0


async def test_the_database_refuses_to_move_a_checkout_or_payment_to_another_merchant(served):
    h, checkout_id, payment_id = served
    for table, pk in (("checkouts", checkout_id), ("payments", payment_id)):
        with pytest.raises(asyncpg.IntegrityConstraintViolationError):
            await h.pool.execute(f"UPDATE {table} SET merchant_id = $2 WHERE id = $1", uuid.UUID(pk), OTHER)
        assert await h.pool.fetchval(f"SELECT merchant_id FROM {table} WHERE id = $1", uuid.UUID(pk)) == TEST_MERCHANT


async def test_row_level_security_shows_a_wrong_merchant_nothing(served, checkout_dsn):
    h, checkout_id, payment_id = served
    async with owner_connection(checkout_dsn) as conn:  # the superuser: probe_role makes a role
        tables = {t["table"]: t for t in await tenant_tables(conn)}
        assert {"checkouts", "payments", "payment_events"} <= set(tables)
        assert all(t["enabled"] and t["forced"] and t["has_policy"] for t in tables.values()), tables
        async with probe_role(conn) as role:
            for table, where, arg in (("checkouts", "id = $1", uuid.UUID(checkout_id)),
                                      ("payments", "id = $1", uuid.UUID(payment_id)),
                                      ("payment_events", "payment_id = $1", uuid.UUID(payment_id))):
                assert await rows_seen(conn, role, table, TEST_MERCHANT, where, arg) >= 1, table
                assert await rows_seen(conn, role, table, "*", where, arg) >= 1, table
                # a forgotten WHERE merchant_id = ... still shows another merchant nothing
                assert await rows_seen(conn, role, table, OTHER) == 0, table
                # unset is nobody's (fail closed): the saga's and customers' paths say '*'
                assert await rows_seen(conn, role, table, None, where, arg) == 0, table
            # the global tables stay readable: the PSP's events and the customers' keys
            assert "psp_events" not in tables and "checkout_idempotency_keys" not in tables
