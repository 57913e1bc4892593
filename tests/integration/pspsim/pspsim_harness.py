"""Test harness: the simulator as a real ``python -m pspsim`` process, a real webhook receiver,
and an async client. (A uniquely named module, so it never collides with other conftests.)"""

from __future__ import annotations

from cutylib.testing.procs import PYTHONPATH
from cutylib.testing.procs import wait_for as _wait_for
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


REPO = Path(__file__).resolve().parents[3]
# The simulator signs with both (a rotation in progress); the receiver only knows the new one.
SIM_SECRETS = "whsec_it_old,whsec_it_new"
RECEIVER_SECRET = "whsec_it_new"
SYNC_TIMEOUT_DELAY = 1.0

FAST_ENV = {
    "CUTY_PSP_WEBHOOK_SECRET": SIM_SECRETS,
    "CUTY_PSP_WEBHOOK_DELAY_MS": "10",
    "CUTY_PSP_WEBHOOK_RETRY_BASE_SECONDS": "0.05",
    "CUTY_PSP_WEBHOOK_RETRY_CAP_SECONDS": "0.2",
    "CUTY_PSP_WEBHOOK_MAX_ATTEMPTS": "30",
    "CUTY_PSP_SYNC_TIMEOUT_DELAY_SECONDS": str(SYNC_TIMEOUT_DELAY),
    "CUTY_PSP_SETTLE_DELAY_MS": "100",
}


async def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``predicate`` (sync or async) until truthy, failing after ``timeout`` seconds."""
    return await _wait_for(predicate, timeout=timeout, interval=0.01, message=what)


# -- webhook receiver ---------------------------------------------------------------------
def independent_verify(header: str, body: bytes, secret: str, tolerance: int = 300) -> bool:
    """A second, independent implementation of the receiver-side check."""
    parts = [p.split("=", 1) for p in header.split(",") if "=" in p]
    ts = [v for k, v in parts if k == "t"]
    if len(ts) != 1 or not ts[0].isdigit() or abs(time.time() - int(ts[0])) > tolerance:
        return False
    expected = hmac.new(secret.encode(), ts[0].encode() + b"." + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, v) for k, v in parts if k == "v1")


@dataclass
class Delivery:
    seq: int
    event: dict
    body: bytes
    signature: str
    signature_ok: bool
    status: int
    at: float

    @property
    def object(self) -> dict:
        return self.event["data"]["object"]

    @property
    def intent_id(self) -> str:
        obj = self.object
        return obj["payment_intent"] if obj.get("object") == "refund" else obj["id"]


class Receiver:
    """Records every delivery; verifies signatures; answers 500 to the first
    ``metadata.receiver_fail_first`` attempts of each event."""

    def __init__(self, secret: str = RECEIVER_SECRET):
        self.secret = secret
        self.deliveries: list[Delivery] = []
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Route("/webhooks", self.handle, methods=["POST"])])

    async def handle(self, request: Request) -> JSONResponse:
        body = await request.body()
        header = request.headers.get("Cuty-Signature", "")
        ok = independent_verify(header, body, self.secret)
        event = json.loads(body)
        fail_first = int(event["data"]["object"].get("metadata", {}).get("receiver_fail_first", 0))
        with self._lock:
            n = self._attempts[event["id"]] = self._attempts.get(event["id"], 0) + 1
            status = 401 if not ok else 500 if n <= fail_first else 200
            self.deliveries.append(Delivery(len(self.deliveries), event, body, header, ok, status, time.monotonic()))
        return JSONResponse({"received": status == 200}, status_code=status)

    def for_intent(self, intent_id: str, acked_only: bool = True) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries
                    if d.intent_id == intent_id and (d.status == 200 or not acked_only)]

    def types(self, intent_id: str) -> list[str]:
        return [d.event["type"] for d in self.for_intent(intent_id)]


# -- simulator process --------------------------------------------------------------------


class SimProcess:
    def __init__(self, log_path: Path, **env: str):
        self.log_path = log_path
        full_env = {**os.environ, **FAST_ENV, "CUTY_PSP_PORT": "0", "CUTY_PSP_HOST": "127.0.0.1", **env}
        # The repository's import paths (as every test process gets them), whether or not pytest
        # was started by make (which exports PYTHONPATH).
        full_env["PYTHONPATH"] = os.pathsep.join([PYTHONPATH, full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "pspsim"], cwd=REPO, env=full_env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self.url = self._await_listening()

    def _await_listening(self, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{") and json.loads(line).get("msg") == "listening":
                    return json.loads(line)["url"]
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.proc.kill()
        raise RuntimeError(f"simulator did not start:\n{self.log_path.read_text(errors='replace')}")

    def log_lines(self) -> list[dict]:
        return [json.loads(l) for l in self.log_path.read_text(errors="replace").splitlines() if l.startswith("{")]

    def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


class Sim:
    """An async client for one simulator."""

    def __init__(self, url: str, client: httpx.AsyncClient):
        self.url = url
        self.http = client

    def create(self, key: str | None, pm: str = "pm_card_ok", amount: int = 1000, timeout: float | None = 5.0,
               **extra: Any):
        body = {"amount": amount, "currency": "TRY", "payment_method": pm, "metadata": {}, **extra}
        headers = {"Idempotency-Key": key} if key is not None else {}
        return self.http.post(f"{self.url}/v1/payment_intents", json=body, headers=headers, timeout=timeout)

    async def get(self, intent_id: str) -> dict:
        r = await self.http.get(f"{self.url}/v1/payment_intents/{intent_id}")
        r.raise_for_status()
        return r.json()

    def post(self, path: str, json: Any = None, key: str | None = None):
        headers = {"Idempotency-Key": key} if key is not None else {}
        return self.http.post(f"{self.url}{path}", json=json, headers=headers)

    async def ledger(self) -> dict:
        return (await self.http.get(f"{self.url}/v1/_ledger")).json()

    async def charges_for(self, key: str) -> int:
        return (await self.ledger())["charge_count_by_key"].get(key, 0)

    async def events(self) -> list[dict]:
        return (await self.http.get(f"{self.url}/v1/_events")).json()["events"]
