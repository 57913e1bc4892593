"""Zero trust inside the cluster, against the real processes `make run` starts (real mutual TLS).

The attack of the service-trust issue, step by step, from "any pod": reserve 100 codes, deliver
them with a made-up payment, read them in plaintext; reveal as a forged admin; refund as `system`.
Every step is refused, while the whole purchase through the gateway still works (the other tests
of this folder run on the same stack)."""
import pathlib
import uuid

import grpc
import pytest

from cuty.booking.v1 import booking_pb2 as bpb, booking_pb2_grpc
from cuty.codepool.v1 import codepool_pb2 as cpb, codepool_pb2_grpc
from cuty.payments.v1 import payments_pb2 as ppb, payments_pb2_grpc
from cutylib.testing.trust import channel_as, user
from cutylib.tls import DevPki, TlsFiles, Transport, issue

FORGED_ADMIN = (("cuty-role", "admin"), ("cuty-subject", "root"))


@pytest.fixture(scope="module")
def pki(stack) -> DevPki:
    return DevPki(stack.data_dir / "tls")  # the stack's development CA (make run created it)


def addr(stack, svc: str) -> str:
    return f"127.0.0.1:{stack.env[f'CUTY_{svc.upper()}_GRPC_PORT']}"


async def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code()


def order() -> dict:
    o = str(uuid.uuid4())
    return {"order_id": o, "order_item_id": o + "/1"}


async def test_no_certificate_no_call(stack, pki):
    for svc, call in (("codepool", lambda ch: codepool_pb2_grpc.CodePoolServiceStub(ch).ReserveCodes(
                          cpb.ReserveCodesRequest(**order(), product_id=str(uuid.uuid4()), quantity=100,
                                                  customer_id="x"), metadata=FORGED_ADMIN, timeout=5)),
                      ("payments", lambda ch: payments_pb2_grpc.PaymentServiceStub(ch).RefundPayment(
                          ppb.RefundPaymentRequest(payment_id=str(uuid.uuid4()), idempotency_key="k"), timeout=5))):
        async with grpc.aio.insecure_channel(addr(stack, svc)) as ch:
            assert await code_of(call(ch)) == grpc.StatusCode.UNAVAILABLE
        # TLS with the right CA but no client certificate.
        creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_path.read_bytes())
        async with grpc.aio.secure_channel(addr(stack, svc), creds,
                                           options=[("grpc.ssl_target_name_override", svc)]) as ch:
            assert await code_of(call(ch)) == grpc.StatusCode.UNAVAILABLE


async def test_a_pod_with_a_certificate_of_no_listed_service_is_refused(stack, pki):
    key, cert = issue(pki.ca_key(), pki.ca_path.read_bytes(), "reporting-job")
    t = Transport("reporting-job", TlsFiles("reporting-job", pki.ca_path.read_bytes(), cert, key))
    async with t.channel(addr(stack, "codepool"), "codepool") as ch:
        cp = codepool_pb2_grpc.CodePoolServiceStub(ch)
        o = order()
        assert await code_of(cp.ReserveCodes(cpb.ReserveCodesRequest(
            **o, product_id=str(uuid.uuid4()), quantity=100, customer_id="x"), timeout=5)) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(cp.DeliverCodes(cpb.DeliverCodesRequest(
            order_id=o["order_id"], payment_transaction_id="free"), timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(cp.GetDeliveredCodes(cpb.GetDeliveredCodesRequest(
            order_id=o["order_id"], customer_id="x"), timeout=5)) == grpc.StatusCode.PERMISSION_DENIED


async def test_finishing_a_purchase_is_for_the_orchestrator_alone(stack, pki):
    """With the gateway's certificate, with or without a user (even an admin), and with the
    orchestrator's certificate but a user's assertion, confirm / deliver / refund are refused."""
    customer, admin = user("mallory", "customer", pki=pki), user("mallory", "admin", pki=pki)
    cases = [("gateway", ()), ("gateway", customer), ("gateway", admin), ("gateway", FORGED_ADMIN),
             ("payments", customer), ("payments", admin)]
    for identity, md in cases:
        async with channel_as(identity, addr(stack, "booking"), "booking", pki=pki) as b, \
                channel_as(identity, addr(stack, "codepool"), "codepool", pki=pki) as c, \
                channel_as(identity, addr(stack, "payments"), "payments", pki=pki) as p:
            calls = {
                "ConfirmHold": booking_pb2_grpc.BookingServiceStub(b).ConfirmHold(
                    bpb.ConfirmHoldRequest(hold_id=str(uuid.uuid4()), payment_ref="free"), metadata=md),
                "ReleaseHold": booking_pb2_grpc.BookingServiceStub(b).ReleaseHold(
                    bpb.ReleaseHoldRequest(hold_id=str(uuid.uuid4())), metadata=md),
                "DeliverCodes": codepool_pb2_grpc.CodePoolServiceStub(c).DeliverCodes(
                    cpb.DeliverCodesRequest(order_id=str(uuid.uuid4()), payment_transaction_id="free"), metadata=md),
                "ReleaseReservation": codepool_pb2_grpc.CodePoolServiceStub(c).ReleaseReservation(
                    cpb.ReleaseReservationRequest(order_id=str(uuid.uuid4())), metadata=md),
                "RefundPayment": payments_pb2_grpc.PaymentServiceStub(p).RefundPayment(
                    ppb.RefundPaymentRequest(payment_id=str(uuid.uuid4()), idempotency_key="k"), metadata=md),
            }
            for name, call in calls.items():
                assert await code_of(call) == grpc.StatusCode.PERMISSION_DENIED, (identity, md[:1], name)


async def test_forged_role_metadata_changes_nothing(stack, pki):
    async with channel_as("gateway", addr(stack, "codepool"), "codepool", pki=pki) as c, \
            channel_as("gateway", addr(stack, "booking"), "booking", pki=pki) as b:
        cp, bk = codepool_pb2_grpc.CodePoolServiceStub(c), booking_pb2_grpc.BookingServiceStub(b)
        assert await code_of(cp.RevealCode(cpb.RevealCodeRequest(code_id=str(uuid.uuid4())),
                                           metadata=FORGED_ADMIN)) == grpc.StatusCode.UNAUTHENTICATED
        assert await code_of(bk.CreateSalon(bpb.CreateSalonRequest(name="x", time_zone="UTC"),
                                            metadata=FORGED_ADMIN)) == grpc.StatusCode.UNAUTHENTICATED
        # A user assertion signed by anyone but the gateway's key.
        other = DevPki(stack.data_dir / "not-the-gateway").ensure()
        assert await code_of(cp.RevealCode(cpb.RevealCodeRequest(code_id=str(uuid.uuid4())),
                                           metadata=user("root", "admin", pki=other))) == grpc.StatusCode.UNAUTHENTICATED


async def test_users_only_from_the_gateway_for_one_service_and_an_admitted_role(stack, pki):
    """Least privilege between the real processes: a valid user assertion (the gateway's key, the
    right audience) is refused from the orchestrator's certificate, even on an RPC it may call; an
    assertion the gateway signed for booking is refused by the code pool; a customer, whom no
    route brings to the code pool, is refused there before any handler."""
    reserve = cpb.ReserveCodesRequest(**order(), product_id=str(uuid.uuid4()), quantity=1, customer_id="")
    async with channel_as("payments", addr(stack, "codepool"), "codepool", pki=pki) as c:
        e = await _error(codepool_pb2_grpc.CodePoolServiceStub(c).ReserveCodes(
            reserve, metadata=user("mallory", "customer", service="codepool", pki=pki), timeout=5))
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "only the gateway" in e.details()
    # A plain channel: the harness's would sign the user again for its target.
    async with Transport("gateway", pki.files("gateway")).channel(addr(stack, "codepool"), "codepool") as raw:
        stock = cpb.GetStockRequest(product_id=str(uuid.uuid4()))
        for_booking = user("root", "admin", service="booking", pki=pki)
        assert await code_of(codepool_pb2_grpc.CodePoolServiceStub(raw).GetStock(
            stock, metadata=for_booking, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    async with channel_as("gateway", addr(stack, "codepool"), "codepool", pki=pki) as c:
        assert await code_of(codepool_pb2_grpc.CodePoolServiceStub(c).GetStock(
            stock, metadata=user("mallory", "customer", pki=pki), timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(codepool_pb2_grpc.CodePoolServiceStub(c).GetStock(
            stock, metadata=user("s", "staff", pki=pki), timeout=5)) == grpc.StatusCode.NOT_FOUND


async def _error(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


async def test_a_customer_token_reaches_none_of_them_through_the_gateway(http, auth):
    paths = await http.get("/openapi.json")
    text = paths.text
    for rpc in ("ConfirmHold", "DeliverCodes", "ReleaseReservation", "RefundPayment", "GetDeliveredCodes",
                "ReserveCodes", "HoldSlot"):
        assert rpc not in text
    me = auth("customer")
    for path in ("/v1/payments/x:cancel", "/v1/codes/x:deliver", "/v1/holds/x:confirm"):
        assert (await http.post(path, headers=me, json={})).status_code in (404, 405)
    # Issue 12: the merchant's refund route is public, for staff and admins only.
    assert (await http.post("/v1/payments/x:refund", headers=me, json={})).status_code == 403


def test_each_process_gets_only_its_own_keys(stack):
    """make run hands each process its own certificate and key; only the gateway the key that
    signs users; the webhook secret reaches neither the gateway nor booking nor codepool."""
    children = stack.state()["children"]
    folder = stack.data_dir / "tls"
    for name in ("gateway", "booking", "codepool", "payments"):
        env = dict(line.split("=", 1) for line in
                   pathlib.Path(f"/proc/{children[name]}/environ").read_bytes().decode().split("\0") if "=" in line)
        assert env["CUTY_TLS_KEY"] == str(folder / f"{name}.key") and env["CUTY_TLS_CERT"] == str(folder / f"{name}.crt")
        assert ("CUTY_USER_ASSERTION_KEY" in env) == (name == "gateway"), name
        assert ("CUTY_JWT_SECRET" in env) == (name == "gateway"), name
        assert ("CUTY_PSP_WEBHOOK_SECRET" in env) == (name == "payments"), name
    assert (folder / "ca.key").stat().st_mode & 0o077 == 0



def test_make_run_delivers_webhooks_from_a_process_of_its_own_with_its_own_database_role(stack):
    """As in Kubernetes: payments delivers nothing itself; `payments-webhooks-out` connects as
    `payments_webhooks_out` and holds no certificate, no PSP secret, no signing key."""
    from cutylib.config import WEBHOOKS_OUT_DB_ROLE
    children = stack.state()["children"]

    def env_of(name: str) -> dict[str, str]:
        return dict(line.split("=", 1) for line in
                    pathlib.Path(f"/proc/{children[name]}/environ").read_bytes().decode().split("\0") if "=" in line)
    assert env_of("payments")["CUTY_WEBHOOKS_OUT_WORKERS"] == "0"
    out = env_of("payments-webhooks-out")
    assert out["CUTY_WEBHOOKS_OUT_DATABASE_URL"].startswith(f"postgresql://{WEBHOOKS_OUT_DB_ROLE}@")
    for secret in ("CUTY_TLS_KEY", "CUTY_USER_ASSERTION_KEY", "CUTY_JWT_SECRET", "CUTY_PSP_WEBHOOK_SECRET"):
        assert secret not in out, secret
