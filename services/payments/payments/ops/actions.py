"""The operator's changes, through the payments gRPC API as the payments service's own identity:
the same code path, checks and idempotency keys as everything else, never a hand-written UPDATE."""
from __future__ import annotations

from ..checkout import domain as saga_domain
from .queries import jsonable, uuid_or_none

OPERATOR_KEY = "cuty-operator"  # payments.operator.OPERATOR_KEY (not imported: keeps the reads light)

# A refund by hand is fine where the saga is (or was) giving the money back anyway; elsewhere it may
# leave a confirmed booking refunded or race a confirm, so it needs --force.
REFUND_WITHOUT_FORCE = ("REFUNDING", "REFUNDED")


def refund_key(payment_id: str, checkout_id: str | None) -> str:
    """The refund's idempotency key: the saga's own (`(checkout id, "refund")`) when the payment has
    a checkout, so a refund by hand and the saga's refund are one refund at the PSP, never two."""
    if checkout_id:
        return saga_domain.refund_key(checkout_id)
    return saga_domain.step_key(payment_id, "ops-refund")


def _channel(addr: str):
    from cutylib.grpc_client import create_channel
    from cutylib.tls import Transport

    return create_channel(addr, "payments", Transport.from_env("payments"), deadline_seconds=30)


async def retry(addr: str, checkout_id: str, by: str):
    from cuty.payments.v1 import checkout_pb2, checkout_pb2_grpc

    async with _channel(addr) as ch:
        return await checkout_pb2_grpc.CheckoutServiceStub(ch).RetryCheckout(
            checkout_pb2.RetryCheckoutRequest(checkout_id=checkout_id), metadata=((OPERATOR_KEY, by),))


async def refund(addr: str, conn, payment_id: str, by: str, reason: str, force: bool):
    from cuty.payments.v1 import payments_pb2, payments_pb2_grpc

    pid = uuid_or_none(payment_id)
    row = await conn.fetchrow("SELECT p.id, p.status, p.checkout_id, c.state, c.attention_from FROM payments p "
                              "LEFT JOIN checkouts c ON c.id = p.checkout_id WHERE p.id = $1", pid) if pid else None
    if row is None:
        raise LookupError(f"payment {payment_id} not found")
    checkout_id = jsonable(row["checkout_id"])
    state = row["attention_from"] or row["state"]
    if checkout_id and state not in REFUND_WITHOUT_FORCE and not force:
        raise PermissionError(
            f"checkout {checkout_id} is {row['state']}"
            + (f" (from {row['attention_from']})" if row["attention_from"] else "")
            + ": a refund by hand there may refund a confirmed booking or race the saga. "
              "Prefer `ops retry`; use --force if the money must go back anyway.")
    async with _channel(addr) as ch:
        return checkout_id, await payments_pb2_grpc.PaymentServiceStub(ch).RefundPayment(
            payments_pb2.RefundPaymentRequest(payment_id=str(pid), idempotency_key=refund_key(str(pid), checkout_id),
                                              reason=reason),
            metadata=((OPERATOR_KEY, by),))
