"""Certificates rotated under a running stack (real processes, real mutual TLS), the way
docs/security.md, "Rotation", does it: every party trusts the old and the new CA, every
certificate is re-issued from the new CA (each key written before its certificate, as a careless
rotation would), then only the new CA is trusted. Nothing is restarted.

Code purchases through the gateway (gateway -> payments -> codepool, and the PSP's webhooks back
through the gateway) keep succeeding all along; once re-issued, every service presents its new
certificate and accepts a peer that has only a certificate of the new CA; at the end, a peer of the
old CA is refused, so the calls that still succeed run on the re-read files."""
from __future__ import annotations

import asyncio
import shutil
import uuid

import grpc
import httpx
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cutylib.grpc_client import create_channel
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import dev_pki, reissue, trust_cas, write_cert
from cutylib.tls import SERVICE_IDENTITIES, DevPki, Transport

from checkout_e2e import customer_headers, start_stack

SERVICES = ("booking", "codepool", "payments")
PROCESSES = ("booking", "codepool", "payments-0", "gateway")


@pytest_asyncio.fixture(scope="module")
async def rotating(pg, tmp_path_factory):
    """A stack on a copy of the session's PKI (same CA and assertion keys, files of its own to rotate)."""
    work = tmp_path_factory.mktemp("checkout-e2e-rotation")
    shutil.copytree(dev_pki().folder, work / "tls")
    s = await start_stack(pg, work, gateway=True, pki=DevPki(work / "tls"), CUTY_TLS_RELOAD_SECONDS=0.5)
    yield s
    await s.close()


async def serving(addr: str, target: str, transport: Transport) -> grpc.StatusCode:
    """The code of a health check over mutual TLS as `transport`, on a new connection."""
    async with create_channel(addr, target, transport, deadline_seconds=3) as ch:
        try:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as e:
            return e.code()


async def test_certificates_rotate_under_a_running_stack(rotating):
    stack, live = rotating.stack, rotating.stack.pki
    addrs = {"booking": stack.booking_addr, "codepool": stack.codepool_addr, "payments": stack.payments_addrs[0]}
    new = DevPki(live.folder.parent / "new-ca").ensure()
    old_peer = Transport("gateway", live.files("gateway"))  # fixed files of the old CA
    new_peer = Transport("gateway", new.files("gateway"))   # trusts the new CA only, presents its certificate
    product = await rotating.new_product(stock=400, price=1000)

    outcomes: list[str] = []
    stop = asyncio.Event()

    async def buy_codes_all_along():
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=20) as http:
            while not stop.is_set():
                r = await http.post("/v1/checkouts", json={"productId": product, "quantity": 1,
                                                           "paymentMethod": "pm_card_ok"},
                                    headers={**customer_headers(), "Idempotency-Key": str(uuid.uuid4())})
                outcomes.append(r.json().get("state") if r.status_code == 200 else f"{r.status_code} {r.text}")
                await asyncio.sleep(0.05)

    async def purchases_go_on():
        n = len(outcomes)
        await wait_for(lambda: len(outcomes) >= n + 3, timeout=60, message="three more purchases")

    buyer = asyncio.create_task(buy_codes_all_along())
    try:
        await purchases_go_on()
        # 1. Everyone trusts both CAs.
        trust_cas(live, live, new)
        await asyncio.sleep(1.5)
        await purchases_go_on()
        # 2. Every identity re-issued from the new CA; each key is seen a while without its certificate.
        certs = {i: reissue(live, i, new, key_only=True) for i in SERVICE_IDENTITIES}
        await asyncio.sleep(1.5)
        await purchases_go_on()
        for identity, cert in certs.items():
            write_cert(live, identity, cert)
        for svc in SERVICES:  # the new certificate presented, a peer of the new CA only accepted
            await wait_for(lambda: _ok(serving(addrs[svc], svc, new_peer)), timeout=30,
                           message=f"{svc} on its new certificate")
        await purchases_go_on()
        # 3. Only the new CA is trusted: a peer of the old one is refused on a new connection.
        trust_cas(live, new)
        for svc in SERVICES:
            await wait_for(lambda: _refused(serving(addrs[svc], svc, old_peer)), timeout=30,
                           message=f"{svc} refusing the old CA")
        await purchases_go_on()
    finally:
        stop.set()
        await buyer
    assert outcomes and set(outcomes) == {"CHECKOUT_STATE_COMPLETED"}, [o for o in outcomes if "COMPLETED" not in o][:5]
    for name in PROCESSES:  # nothing restarted; each process re-read its files
        assert stack.procs[name].proc.poll() is None, name
        assert "TLS certificate reloaded" in stack.procs[name].log_path.read_text(errors="replace"), name


async def _ok(check) -> bool:
    return await check == grpc.StatusCode.OK


async def _refused(check) -> bool:
    return await check == grpc.StatusCode.UNAVAILABLE
