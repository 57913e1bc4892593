"""`make run`: the whole platform on one machine, supervised.

Postgres (embedded in CUTY_DATA_DIR unless CUTY_DATABASE_URL is given), the PSP simulator (its
webhooks go to the gateway), booking, codepool, payments and the gateway on CUTY_HTTP_PORT; demo
data on first start; a demo token per role. Every variable of the README's configuration table
passes through to the processes unchanged. A process that dies is reported and restarted with back-off.
Ctrl-C / SIGTERM stops everything, Postgres included; the next run reuses the data.

The children run in their own sessions, so a terminal's Ctrl-C reaches only this supervisor,
which then stops them in order (gateway first, Postgres last) instead of all dying at once.
`CUTY_DATA_DIR/devstack.json` describes the running stack (pids, URLs) for tools and tests.
"""
from __future__ import annotations

import json
import os
import shutil
import pathlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .config import (DEV_JWT_SECRET, SERVICES, WEBHOOKS_OUT_HEALTH_PORT, WEBHOOKS_OUT_METRICS_PORT, env_int,
                     health_port_for)
from .metrics import METRICS_PORTS
from .tls import SERVICE_IDENTITIES

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(str(REPO / p) for p in (
    "build/gen", "libs", "services/booking", "services/codepool", "services/payments",
    "services/gateway", "services/pspsim", "."))
GRACE_SECONDS = 10.0
# Each secret goes only to the process that holds it (docs/security.md); the PSP simulator signs
# webhooks with the webhook secret, as the real PSP holds its copy.
WEBHOOKS_OUT = "payments-webhooks-out"  # the webhook delivery process, `python -m payments webhooks-out`
OWNED_SECRETS = {"CUTY_JWT_SECRET": {"gateway"}, "CUTY_CODE_KEYS": {"codepool"},
                 "CUTY_PSP_WEBHOOK_SECRET": {"payments", "pspsim"}, "CUTY_PSP_WEBHOOK_PREVIOUS_SECRETS": {"payments"}}


# The demo's internal client (docs/clients.md): the till of examples/pos_checkout.py, with a
# certificate of its own in the development PKI; it buys as itself, and for a customer whose token
# it forwards when the tokens are the development ones (the services verify them with that secret).
DEMO_CLIENT = "pos"


def demo_clients(forward_users: bool) -> str:
    entry = {"identity": DEMO_CLIENT, "acts_as": {"role": "customer", "subject": "pos-till-1"}}
    if forward_users:
        entry["users"] = ["customer"]
    return json.dumps({"clients": [entry]})


def say(msg: str) -> None:
    print(f"[cuty] {msg}", flush=True)


def _die_with_parent() -> None:
    """Child pre-exec: own session (no terminal signals) and SIGTERM if the supervisor is killed."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Child:
    name: str
    module: str
    health_port: int | None = None  # plaintext gRPC health (the service port is mutual TLS)
    http_health: str | None = None
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    env: dict = field(default_factory=dict)
    command: list[str] | None = None  # a program of its own instead of `python -m <module>`


class DevStack:
    def __init__(self, environ: dict[str, str] | None = None):
        e = dict(os.environ if environ is None else environ)
        self.data_dir = pathlib.Path(e.get("CUTY_DATA_DIR") or ".cuty").absolute()
        self.logs = self.data_dir / "logs"
        self.http_port = int(e.get("CUTY_HTTP_PORT") or 8080)
        self.gateway_url = f"http://127.0.0.1:{self.http_port}"
        self.external_db = e.get("CUTY_DATABASE_URL", "")
        self.pg_port = int(e.get("CUTY_PG_PORT") or 5439)
        self.cluster = None
        psp_url = e.get("CUTY_PSP_URL") or "http://127.0.0.1:8090"
        psp_port = int(e.get("CUTY_PSP_PORT") or urlsplit(psp_url).port or 8090)
        self.jwt_secret = e.get("CUTY_JWT_SECRET") or DEV_JWT_SECRET
        self.dev_secret = not e.get("CUTY_JWT_SECRET")
        self.env = {**e, "PYTHONPATH": PYTHONPATH + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else ""),
                    "CUTY_DATA_DIR": str(self.data_dir), "CUTY_HTTP_PORT": str(self.http_port),
                    "CUTY_PSP_URL": psp_url, "CUTY_PSP_PORT": str(psp_port),
                    "CUTY_PSP_WEBHOOK_URL": e.get("CUTY_PSP_WEBHOOK_URL") or f"{self.gateway_url}/v1/psp/webhooks"}
        self.env.setdefault("CUTY_INTERNAL_CLIENTS", demo_clients(self.dev_secret))
        self.children = [Child("pspsim", "pspsim", http_health=f"{psp_url}/healthz")]
        for svc, (_, default_port) in SERVICES.items():
            port = int(e.get(f"CUTY_{svc.upper()}_GRPC_PORT") or default_port)
            health = int(e.get(f"CUTY_{svc.upper()}_HEALTH_PORT") or health_port_for(svc))
            self.env[f"CUTY_{svc.upper()}_GRPC_PORT"] = str(port)
            self.env[f"CUTY_{svc.upper()}_HEALTH_PORT"] = str(health)
            self.env.setdefault(f"CUTY_{svc.upper()}_ADDR", f"127.0.0.1:{port}")
            self.children.append(Child(svc, svc, health_port=health))
        # The merchants' webhook delivery in a process of its own, as in Kubernetes (docs/webhooks-out.md,
        # "A process of its own"): payments delivers nothing itself.
        self.webhooks_out_health = int(e.get("CUTY_WEBHOOKS_OUT_HEALTH_PORT") or WEBHOOKS_OUT_HEALTH_PORT)
        self.webhooks_out_metrics = int(e.get("CUTY_WEBHOOKS_OUT_METRICS_PORT") or WEBHOOKS_OUT_METRICS_PORT)
        self.child("payments").env["CUTY_WEBHOOKS_OUT_WORKERS"] = "0"
        self.children.append(Child(WEBHOOKS_OUT, "payments", health_port=self.webhooks_out_health,
                                   command=[sys.executable, "-m", "payments", "webhooks-out"],
                                   env={"CUTY_WEBHOOKS_OUT_WORKERS": e.get("CUTY_WEBHOOKS_OUT_WORKERS") or "2",
                                        "CUTY_WEBHOOKS_OUT_HEALTH_PORT": str(self.webhooks_out_health),
                                        "CUTY_WEBHOOKS_OUT_METRICS_PORT": str(self.webhooks_out_metrics)}))
        self.children.append(Child("gateway", "gateway", http_health=f"{self.gateway_url}/healthz"))
        self.tls = e.get("CUTY_TLS", "on").lower() != "off" and not e.get("CUTY_TLS_CERT")
        # Each process serves /metrics on a port of its own (cutylib.metrics).
        self.metrics_ports = {svc: int(e.get(f"CUTY_{svc.upper()}_METRICS_PORT") or default)
                              for svc, default in METRICS_PORTS.items()}
        self.env.update({f"CUTY_{svc.upper()}_METRICS_PORT": str(p) for svc, p in self.metrics_ports.items()})
        # A local Prometheus scraping the four processes with the alert rules, when installed.
        self.prometheus_bin = shutil.which("prometheus") if e.get("CUTY_PROMETHEUS", "on") != "off" else None
        self.prometheus_port = int(e.get("CUTY_PROMETHEUS_PORT") or 9090)
        if self.prometheus_bin:
            self.children.append(Child("prometheus", "", command=self.prometheus_command(),
                                       http_health=f"http://127.0.0.1:{self.prometheus_port}/-/ready"))
        self.stopping = False

    def busy_ports(self) -> list[str]:
        """Ports another program already holds, named by the variable that moves them."""
        wanted = {"CUTY_HTTP_PORT": self.http_port, "CUTY_PSP_URL (its port)": int(self.env["CUTY_PSP_PORT"])}
        for svc in SERVICES:
            for kind in ("GRPC", "HEALTH"):
                wanted[f"CUTY_{svc.upper()}_{kind}_PORT"] = int(self.env[f"CUTY_{svc.upper()}_{kind}_PORT"])
        for svc, port in self.metrics_ports.items():
            if port:
                wanted[f"CUTY_{svc.upper()}_METRICS_PORT"] = port
        wanted["CUTY_WEBHOOKS_OUT_HEALTH_PORT"] = self.webhooks_out_health
        if self.webhooks_out_metrics:
            wanted["CUTY_WEBHOOKS_OUT_METRICS_PORT"] = self.webhooks_out_metrics
        if self.prometheus_bin:
            wanted["CUTY_PROMETHEUS_PORT"] = self.prometheus_port
        busy = []
        for var, port in wanted.items():
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    busy.append(f"{port} ({var})")
        return busy

    # Postgres -------------------------------------------------------------------------------------
    def start_postgres(self) -> None:
        if self.external_db:
            say(f"using the database server of CUTY_DATABASE_URL (databases cuty_booking, cuty_codepool, cuty_payments)")
            return
        from .pgcluster import LocalCluster

        self.cluster = LocalCluster(self.data_dir / "pg", self.pg_port)
        fresh = not (self.cluster.datadir / "PG_VERSION").exists()
        if self.cluster.is_running():
            say(f"Postgres already running in {self.cluster.datadir}; reusing it")
        else:
            say(("initialising" if fresh else "starting") + f" Postgres in {self.cluster.datadir} on port {self.pg_port}")
            # In a session of its own (see the module docstring), so Ctrl-C does not stop it under the services.
            r = subprocess.run([sys.executable, "-c", "import sys; from cutylib.pgcluster import LocalCluster; "
                                "LocalCluster(sys.argv[1], int(sys.argv[2])).start()",
                                str(self.cluster.datadir), str(self.pg_port)],
                               env=self.env, start_new_session=True, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"[cuty] Postgres did not start:\n{r.stderr.strip()[-3000:]}")
        self.env["CUTY_DATABASE_URL"] = self.cluster.dsn
        self.service_roles()

    def service_roles(self) -> None:
        """Each service connects as its own role, which owns nothing and is bound by Row-Level
        Security; its migrations run as the cluster's owner (docs/security.md, "Database roles").
        Only on the embedded cluster: with CUTY_DATABASE_URL the roles are yours to give."""
        import asyncio

        from .config import WEBHOOKS_OUT_DB_ROLE, db_role_for, with_database, with_user
        from .db import ensure_service_role

        async def create() -> None:
            for role in [db_role_for(s) for s in SERVICES] + [WEBHOOKS_OUT_DB_ROLE]:
                await ensure_service_role(self.cluster.dsn, role)
        asyncio.run(create())
        self.env["CUTY_MIGRATION_DATABASE_URL"] = self.cluster.dsn
        for svc, (dbname, _) in SERVICES.items():
            self.env.setdefault(f"CUTY_{svc.upper()}_DATABASE_URL",
                                with_user(with_database(self.cluster.dsn, dbname), db_role_for(svc)))
        self.env.setdefault("CUTY_WEBHOOKS_OUT_DATABASE_URL", with_user(
            with_database(self.cluster.dsn, SERVICES["payments"][0]), WEBHOOKS_OUT_DB_ROLE))
        say("services connect as their own database roles (" + ", ".join(db_role_for(s) for s in SERVICES)
            + f", {WEBHOOKS_OUT_DB_ROLE} for {WEBHOOKS_OUT})")

    def stop_postgres(self) -> None:
        if self.cluster is not None:
            say("stopping Postgres")
            self.cluster.stop()

    # Processes ------------------------------------------------------------------------------------
    def prometheus_command(self) -> list[str]:
        """Prometheus on this stack's metrics ports (a config written under CUTY_DATA_DIR), with
        deploy/observability's alert rules and exemplar storage (the trace ids)."""
        folder = self.data_dir / "prometheus"
        folder.mkdir(parents=True, exist_ok=True)
        rules = REPO / "deploy" / "observability" / "prometheus" / "rules" / "cuty.rules.yml"
        jobs = "".join(f"  - job_name: cuty-{svc}\n    static_configs: [{{targets: [\"127.0.0.1:{port}\"]}}]\n"
                       for svc, port in [*self.metrics_ports.items(), ("webhooks-out", self.webhooks_out_metrics)]
                       if port)
        (folder / "prometheus.yml").write_text(
            "# Written by `make run` (cutylib.devstack) for this stack's ports.\n"
            f"global: {{scrape_interval: 5s, evaluation_interval: 5s}}\nrule_files: [\"{rules}\"]\n"
            f"scrape_configs:\n{jobs}")
        return [self.prometheus_bin, f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                "--enable-feature=exemplar-storage", "--log.level=warn"]

    def make_pki(self) -> None:
        """A development CA and a certificate per service (mutual TLS), and the gateway's key for
        signing user assertions, in CUTY_DATA_DIR/tls; each process gets only its own key."""
        if not self.tls:
            say("CUTY_TLS=off: services talk plaintext gRPC (development only)")
            return
        from .tls import DevPki

        pki = DevPki(self.data_dir / "tls").ensure((*SERVICE_IDENTITIES, DEMO_CLIENT))
        for c in self.children:
            if c.name in SERVICE_IDENTITIES:
                c.env.update(pki.env(c.name))
        say(f"mutual TLS between services: development CA in {pki.folder}")

    def spawn(self, c: Child) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{c.name}.log", "ab") as log:
            env = {k: v for k, v in self.env.items() if c.name in OWNED_SECRETS.get(k, {c.name})}
            argv = c.command or [sys.executable, "-m", c.module]
            c.proc = subprocess.Popen(argv, env={**env, **c.env}, cwd=str(REPO),
                                      stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        c.started_at = time.monotonic()
        self.write_state()

    def healthy(self, c: Child) -> bool:
        try:
            if c.health_port:
                import grpc
                from grpc_health.v1 import health_pb2, health_pb2_grpc

                with grpc.insecure_channel(f"127.0.0.1:{c.health_port}") as ch:
                    r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    return r.status == health_pb2.HealthCheckResponse.SERVING
            import httpx

            return httpx.get(c.http_health, timeout=2).status_code == 200
        except Exception:  # noqa: BLE001 - not up (yet)
            return False

    def wait_healthy(self, names: list[str], timeout: float) -> list[str]:
        """Names still unhealthy after `timeout` (crashed ones are restarted meanwhile)."""
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending and time.monotonic() < deadline and not self.stopping:
            self.reap()
            pending = [n for n in pending if not self.healthy(self.child(n))]
            if pending:
                time.sleep(0.2)
        return pending

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def tail(self, c: Child, n: int = 1500) -> str:
        try:
            return (self.logs / f"{c.name}.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def reap(self) -> None:
        """Report and restart exited children, with back-off so a crash loop does not spin."""
        now = time.monotonic()
        for c in self.children:
            if c.proc is None or self.stopping:
                continue
            code = c.proc.poll()
            if code is None:
                if c.restarts and now - c.started_at > 60:
                    c.restarts = 0  # it stayed up: the next crash starts the back-off afresh
                continue
            if c.next_start == 0.0:
                delay = min(30.0, 0.5 * 2 ** c.restarts)
                c.next_start = now + delay
                say(f"{c.name} exited with code {code}; restarting in {delay:.1f} s "
                    f"(log: {self.logs / (c.name + '.log')}):\n" + self.tail(c, 800))
            elif now >= c.next_start:
                c.restarts += 1
                c.next_start = 0.0
                self.spawn(c)
                say(f"{c.name} restarted (pid {c.proc.pid})")

    def stop_children(self) -> None:
        for c in reversed(self.children):  # gateway first, so no request meets a stopped service
            if c.proc is not None and c.proc.poll() is None:
                c.proc.terminate()
                try:
                    c.proc.wait(GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    say(f"{c.name} did not stop within {GRACE_SECONDS:g} s; killing it")
                    c.proc.kill()
                    c.proc.wait(5)

    def write_state(self, **extra) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        state = {"pid": os.getpid(), "gateway_url": self.gateway_url, "database_url": self.env.get("CUTY_DATABASE_URL", ""),
                 "children": {c.name: c.proc.pid for c in self.children if c.proc is not None}}
        prev = self.state()
        state.update({k: v for k, v in prev.items() if k not in state}, **extra)
        tmp = self.data_dir / "devstack.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.data_dir / "devstack.json")

    def state(self) -> dict:
        try:
            return json.loads((self.data_dir / "devstack.json").read_text())
        except (OSError, ValueError):
            return {}

    # The whole run --------------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        busy = self.busy_ports()
        if busy:
            say(f"port(s) already in use: {', '.join(busy)}. Is another `make run` up? Stop it, or set those "
                "variables (and CUTY_DATA_DIR) for a second stack; see docs/running.md.")
            return 1
        (self.data_dir / "devstack.json").unlink(missing_ok=True)
        try:
            self.start_postgres()
            self.make_pki()
            self.write_state(ready=False)
            for c in self.children:
                self.spawn(c)
            slow = self.wait_healthy([c.name for c in self.children], env_int("CUTY_DEVSTACK_START_TIMEOUT", 90))
            if self.stopping:
                return 0
            if slow:
                say(f"not healthy yet: {', '.join(slow)} (see {self.logs}); continuing, they are restarted if they exit")
            demo = self.seed()
            self.write_state(ready=True, demo=demo)
            self.banner(demo)
            while not self.stopping:
                self.reap()
                time.sleep(0.2)
            return 0
        finally:
            say("stopping")
            self.stopping = True
            self.stop_children()
            self.stop_postgres()
            self.write_state(ready=False, stopped=True)
            say("stopped")

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def seed(self) -> dict:
        from .demo import ensure_demo_data

        try:
            return ensure_demo_data(self.gateway_url, self.jwt_secret, self.data_dir, say)
        except Exception as e:  # noqa: BLE001 - the stack is still useful without demo data
            say(f"demo data not created ({type(e).__name__}: {e}); it is tried again on the next start")
            return {}

    def banner(self, demo: dict) -> None:
        from .demo import demo_tokens

        tokens = demo_tokens(self.jwt_secret)
        lines = ["", "Cuty is running.",
                 f"  gateway    {self.gateway_url}   (GET /healthz, GET /openapi.json)",
                 f"  PSP sim    {self.env['CUTY_PSP_URL']}",
                 f"  database   {self.env.get('CUTY_DATABASE_URL')}" + ("" if self.external_db else f"  (data in {self.data_dir / 'pg'})"),
                 f"  metrics    " + "  ".join(f"{svc} :{port}" for svc, port in self.metrics_ports.items())
                 + "   (GET /metrics)",
                 (f"  prometheus http://127.0.0.1:{self.prometheus_port}   (alert rules loaded; dashboards: "
                  "deploy/observability/dashboards)" if self.prometheus_bin else
                  "  prometheus not installed: apt-get install prometheus (Debian), then `make run` starts one"),
                 f"  logs       {self.logs}/<service>.log"]
        if demo:
            lines += [f"  demo salon {demo['salon_id']} (Europe/Istanbul, 2 stylists, {demo['slots']} slots; "
                      f"merchant {demo.get('salon_merchant', '?')})",
                      f"  product    {demo['product_id']} ({demo['codes']} codes; merchant {demo.get('shop_merchant', '?')})"]
        lines += ["", "Demo tokens (7 days; staff and admins belong to the merchant after the @):"]
        lines += [f"  {role:<18} {tok}" for role, tok in tokens.items()]
        if self.dev_secret:
            lines += ["", "NOTE: signed with the dev-only JWT secret (CUTY_JWT_SECRET unset). Never use it outside development."]
        if demo:
            day = time.strftime("%Y-%m-%d", time.gmtime())
            lines += ["", "Try (TOKEN=<the customer token>):", f"  curl -H \"Authorization: Bearer $TOKEN\" "
                      f"'{self.gateway_url}/v1/salons/{demo['salon_id']}/slots?startTime={day}T00:00:00Z"
                      f"&endTime={time.strftime('%Y-%m-%d', time.gmtime(time.time() + 9 * 86400))}T00:00:00Z&availableOnly=true'",
                      "  make demo"]
            if self.tls:
                tls = self.data_dir / "tls"
                lines += ["", f"An internal client on the gRPC API (docs/clients.md), the till registered as {DEMO_CLIENT!r}:",
                          f"  {sys.executable} examples/pos_checkout.py --ca {tls / 'ca.crt'} --cert {tls / (DEMO_CLIENT + '.crt')} "
                          f"--key {tls / (DEMO_CLIENT + '.key')} --payments {self.env['CUTY_PAYMENTS_ADDR']} "
                          f"--booking {self.env['CUTY_BOOKING_ADDR']} --codepool {self.env['CUTY_CODEPOOL_ADDR']} "
                          f"--salon {demo['salon_id']} --product {demo['product_id']}"
                          + (" --customer-token $TOKEN" if self.dev_secret else "")]
        lines += ["", "Ctrl-C stops everything (Postgres too); the next `make run` reuses the data.", ""]
        print("\n".join(lines), flush=True)


def main() -> int:
    return DevStack().run()


if __name__ == "__main__":
    sys.exit(main())
