"""The platform as real processes for e2e tests: PSP simulator, booking, codepool, payments (N replicas),
and the webhook route (the gateway when present, else the in-process relay).

    stack = Stack(pg.dsn, tmp_path, env={"CUTY_HOLD_TTL_SECONDS": 5})
    await stack.start()
    ... stack.booking_addr, stack.payments_addrs[0], stack.psp_url ...
    await stack.stop()

`Stack(..., gateway=True)` also runs `python -m gateway` (HTTP on `stack.gateway_url`) and points
the PSP's webhooks at it instead of the relay, so webhooks take the production path.
"""
from __future__ import annotations

import asyncio
import pathlib

import httpx

from ..config import DEV_WEBHOOK_SECRET
from ..metrics import METRICS_PORTS
from ..pgcluster import free_port
from .postgres import ensure_service_roles
from .procs import ServiceProcess, base_env
from ..tls import SERVICE_IDENTITIES, DevPki
from .trust import channel_as, dev_pki
from .webhook_relay import WebhookRelay


class Stack:
    def __init__(self, pg_dsn: str, workdir: str | pathlib.Path, *,
                 services: tuple[str, ...] = ("booking", "codepool", "payments"),
                 payments_replicas: int = 1, env: dict | None = None,
                 service_env: dict[str, dict] | None = None, gateway: bool = False, pki: DevPki | None = None):
        self.pg_dsn = pg_dsn
        self.workdir = pathlib.Path(workdir)
        self.services = services
        self.payments_replicas = payments_replicas
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.service_env = service_env or {}
        self.ports = {s: free_port() for s in ("booking", "codepool")}
        self.payments_ports = [free_port() for _ in range(payments_replicas)]
        self.psp_port = free_port()
        self.gateway = gateway
        self.http_port = free_port() if gateway else None
        self.relay: WebhookRelay | None = None
        # The session's development PKI: tests sign users and dial services with the same CA.
        self.pki = pki or dev_pki()
        self.secure = self.env.get("CUTY_TLS", "on").lower() != "off"  # CUTY_TLS=off: plaintext (benchmarks)
        self.procs: dict[str, ServiceProcess] = {}
        self.metrics_ports: dict[str, int] = {}  # process name -> its /metrics port

    # Addresses -----------------------------------------------------------------------------------
    @property
    def booking_addr(self) -> str:
        return f"127.0.0.1:{self.ports['booking']}"

    @property
    def codepool_addr(self) -> str:
        return f"127.0.0.1:{self.ports['codepool']}"

    @property
    def payments_addrs(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.payments_ports]

    @property
    def gateway_url(self) -> str:
        if not self.gateway:
            raise RuntimeError("this Stack runs no gateway; create it with gateway=True")
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def psp_url(self) -> str:
        return f"http://127.0.0.1:{self.psp_port}"

    def common_env(self) -> dict[str, str]:
        return base_env(
            CUTY_DATABASE_URL=self.pg_dsn,
            CUTY_DATA_DIR=str(self.workdir / "data"),
            CUTY_BOOKING_ADDR=self.booking_addr,
            CUTY_CODEPOOL_ADDR=self.codepool_addr,
            CUTY_PAYMENTS_ADDR=self.payments_addrs[0],
            CUTY_PSP_URL=self.psp_url,
            CUTY_PSP_PORT=self.psp_port,
            CUTY_PSP_WEBHOOK_SECRET=DEV_WEBHOOK_SECRET,
            CUTY_PSP_WEBHOOK_DELAY_MS=20,
            # Merchant webhooks to the tests' local receivers (127.0.0.1): a development-only setting.
            CUTY_WEBHOOK_ALLOW_PRIVATE=1,
            **self.env,
        )

    def _proc(self, name: str, module: str, port: int | None, http_url: str | None = None, **extra) -> ServiceProcess:
        env = self.common_env()
        env.update(self.trust_env(module))
        env.update({k: str(v) for k, v in extra.items()})
        if name.split("-")[0] in METRICS_PORTS:
            self.metrics_ports[name] = self.metrics_ports.get(name) or free_port()
            env[f"CUTY_{name.split('-')[0].upper()}_METRICS_PORT"] = str(self.metrics_ports[name])
        env.update({k: str(v) for k, v in self.service_env.get(name.split("-")[0], {}).items()})
        env.update({k: str(v) for k, v in self.service_env.get(name, {}).items()})
        p = ServiceProcess(module, env, self.workdir / "logs" / f"{name}.log", grpc_port=port, http_url=http_url)
        self.procs[name] = p
        return p

    def trust_env(self, identity: str) -> dict[str, str]:
        """Each process gets only its own certificate and key (mutual TLS), the gateway alone the
        key that signs user assertions, the services its public half (docs/security.md)."""
        if identity not in SERVICE_IDENTITIES:
            return {}
        return self.pki.env(identity)

    def channel(self, identity: str, target: str, addr: str | None = None, **kw):
        """A channel to `target` (default address: its first process) with `identity`'s certificate."""
        addr = addr or {"booking": self.booking_addr, "codepool": self.codepool_addr}.get(target) or self.payments_addrs[0]
        return channel_as(identity, addr, target, pki=self.pki, secure=self.secure, **kw)

    async def start(self) -> "Stack":
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The services connect as their own database roles (procs.as_service_role), on whatever
        # server this stack was given: make sure they exist there.
        await ensure_service_roles(self.pg_dsn)
        if self.gateway:
            webhook_url = f"{self.gateway_url}/v1/psp/webhooks"
        elif "payments" in self.services:
            self.relay = await WebhookRelay(self.payments_addrs, pki=self.pki, secure=self.secure).start()
            webhook_url = self.relay.url
        else:
            webhook_url = "http://127.0.0.1:9/none"
        psp = self._proc("pspsim", "pspsim", None, http_url=f"{self.psp_url}/v1/_ledger",
                         CUTY_PSP_WEBHOOK_URL=webhook_url)
        psp.start()
        started = [psp]
        for s in ("booking", "codepool"):
            if s in self.services:
                started.append(self._proc(s, s, self.ports[s], **{f"CUTY_{s.upper()}_GRPC_PORT": self.ports[s]}).start())
        if "payments" in self.services:
            for i, port in enumerate(self.payments_ports):
                started.append(self._proc(f"payments-{i}", "payments", port, CUTY_PAYMENTS_GRPC_PORT=port).start())
        if self.gateway:
            # /openapi.json answers once the gateway serves (/healthz stays 503 while any service is down).
            # Every payments replica, round robin (a gRPC `ipv4:` target lists several addresses).
            started.append(self._proc("gateway", "gateway", None, http_url=f"{self.gateway_url}/openapi.json",
                                      CUTY_HTTP_PORT=self.http_port,
                                      CUTY_PAYMENTS_ADDR="ipv4:" + ",".join(self.payments_addrs)).start())
        await asyncio.gather(*(p.wait_healthy(60) for p in started))
        return self

    async def restart(self, name: str) -> ServiceProcess:
        """Start a (killed) process again with the same environment and port; wait until healthy."""
        old = self.procs[name]
        old.stop()
        p = ServiceProcess(old.module, old.env, old.log_path, grpc_port=old.grpc_port, http_url=old.http_url)
        self.procs[name] = p
        p.start()
        await p.wait_healthy(60)
        return p

    async def psp_ledger(self) -> dict:
        async with httpx.AsyncClient(timeout=5) as c:
            return (await c.get(f"{self.psp_url}/v1/_ledger")).json()

    async def stop(self) -> None:
        for p in self.procs.values():
            p.stop()
        if self.relay:
            await self.relay.stop()
