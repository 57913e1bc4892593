"""Real service processes for e2e tests: start, wait until healthy, SIGTERM/SIGKILL/SIGSTOP."""
from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..metrics import METRICS_PORTS
from ..pgcluster import free_port

REPO = pathlib.Path(__file__).resolve().parents[3]
PYTHONPATH = os.pathsep.join(str(REPO / p) for p in (
    "build/gen", "libs", "services/booking", "services/codepool", "services/payments",
    "services/gateway", "services/pspsim", "."))


def base_env(**overrides: str | int | float) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHONPATH
    env.setdefault("CUTY_LOG_LEVEL", "INFO")
    # Never the fixed metrics ports (9464-9467): parallel test runs would collide; 0 = any free port.
    env.update({f"CUTY_{s.upper()}_METRICS_PORT": "0" for s in METRICS_PORTS})
    env["CUTY_WEBHOOKS_OUT_METRICS_PORT"] = "0"  # python -m payments webhooks-out
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def as_service_role(module: str, env: dict[str, str]) -> dict[str, str]:
    """`env` for a service process that connects as the service's own database role and migrates
    as the DSN's user (the test server's superuser), as in production (docs/security.md,
    "Database roles"); unchanged for other programs, when the environment names a migration DSN
    already, or with CUTY_TEST_DB_ROLE=owner. The roles exist on the test server
    (cutylib.testing.postgres.start_test_postgres)."""
    from ..config import SERVICES, db_role_for, with_database, with_user

    upper = module.upper()
    if module not in SERVICES or module == "gateway" or env.get("CUTY_TEST_DB_ROLE", "service") == "owner" \
            or env.get(f"CUTY_{upper}_MIGRATION_DATABASE_URL") or env.get("CUTY_MIGRATION_DATABASE_URL"):
        return env
    dsn = env.get(f"CUTY_{upper}_DATABASE_URL") or (
        with_database(env["CUTY_DATABASE_URL"], SERVICES[module][0]) if env.get("CUTY_DATABASE_URL") else "")
    if not dsn:
        return env
    return {**env, f"CUTY_{upper}_MIGRATION_DATABASE_URL": dsn,
            f"CUTY_{upper}_DATABASE_URL": with_user(dsn, db_role_for(module))}


class ServiceProcess:
    """`python -m <module>` as a child process, its output in `log_path`."""

    def __init__(self, module: str, env: dict[str, str], log_path: str | os.PathLike, *,
                 grpc_port: int | None = None, http_url: str | None = None):
        self.module = module
        self.env = env
        self.log_path = pathlib.Path(log_path)
        self.grpc_port = grpc_port
        self.http_url = http_url
        # The service port is mutual TLS; health is polled in plaintext on the process's health port.
        self.health_port: int | None = None
        if grpc_port:
            var = f"CUTY_{module.upper()}_HEALTH_PORT"
            if not env.get(var):
                env[var] = str(free_port())
            self.health_port = int(env[var])
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServiceProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", self.module], env=as_service_role(self.module, self.env),
                                     stdout=log,
                                     stderr=subprocess.STDOUT, cwd=str(REPO))
        log.close()
        return self

    async def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.module} exited with {self.proc.returncode}; log:\n{self.tail()}")
            try:
                if self.health_port:
                    async with grpc.aio.insecure_channel(f"127.0.0.1:{self.health_port}") as ch:
                        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                        if resp.status == health_pb2.HealthCheckResponse.SERVING:
                            return
                elif self.http_url:
                    import httpx

                    async with httpx.AsyncClient(timeout=1) as c:
                        if (await c.get(self.http_url)).status_code < 500:
                            return
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.module} not healthy after {timeout}s ({last}); log:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait(10)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> int | None:
        if not self.proc:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, message: str = "condition"):
    """Await until `predicate()` (sync or async) returns a truthy value; return it. No bare sleeps in tests."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


__all__ = ["ServiceProcess", "base_env", "free_port", "wait_for", "REPO", "PYTHONPATH"]
