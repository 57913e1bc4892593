"""The platform started the way `make run` starts it (`python -m cutylib.devstack`), on free ports in
a temporary CUTY_DATA_DIR, once per session; tests speak HTTP to its gateway."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import httpx
import jwt
import pytest
import pytest_asyncio

from cutylib.pgcluster import free_port
from cutylib.testing.procs import PYTHONPATH, REPO, wait_for
from cutylib.testing.trust import org_for

SECRET = "e2e-jwt-secret-0123456789abcdefghijklmnop"
WEBHOOK_SECRET = "whsec_e2e_gateway_0123456789"


class Devstack:
    """One `python -m cutylib.devstack` process and what it reports in CUTY_DATA_DIR/devstack.json."""

    def __init__(self, data_dir: pathlib.Path, **env: str):
        self.data_dir = data_dir
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        base = {k: v for k, v in os.environ.items() if not (k.startswith("CUTY_") and k.endswith("_ADDR"))}
        base.pop("CUTY_DATABASE_URL", None)
        if os.environ.get("CUTY_TEST_DSN"):  # no local Postgres binaries: use the test server
            base["CUTY_DATABASE_URL"] = os.environ["CUTY_TEST_DSN"]
        self.env = {**base, "PYTHONPATH": PYTHONPATH, "CUTY_DATA_DIR": str(data_dir),
                    "CUTY_HTTP_PORT": str(self.http_port), "CUTY_PG_PORT": str(free_port()),
                    "CUTY_BOOKING_GRPC_PORT": str(free_port()), "CUTY_CODEPOOL_GRPC_PORT": str(free_port()),
                    "CUTY_PAYMENTS_GRPC_PORT": str(free_port()), "CUTY_PSP_URL": f"http://127.0.0.1:{free_port()}",
                    "CUTY_BOOKING_HEALTH_PORT": str(free_port()), "CUTY_CODEPOOL_HEALTH_PORT": str(free_port()),
                    "CUTY_PAYMENTS_HEALTH_PORT": str(free_port()), "CUTY_PROMETHEUS_PORT": str(free_port()),
                    "CUTY_WEBHOOKS_OUT_HEALTH_PORT": str(free_port()), "CUTY_WEBHOOKS_OUT_METRICS_PORT": str(free_port()),
                    **{f"CUTY_{s}_METRICS_PORT": str(free_port()) for s in ("GATEWAY", "BOOKING", "CODEPOOL", "PAYMENTS")},
                    "CUTY_JWT_SECRET": SECRET, "CUTY_PSP_WEBHOOK_SECRET": WEBHOOK_SECRET,
                    "CUTY_PSP_WEBHOOK_DELAY_MS": "20",
                    # merchant webhooks to the tests' local receivers: the explicit development setting
                    "CUTY_WEBHOOK_ALLOW_PRIVATE": "1", **env}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Devstack":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.data_dir / "devstack.out", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "cutylib.devstack"], env=self.env, cwd=str(REPO),
                                     stdout=out, stderr=subprocess.STDOUT)
        out.close()
        return self

    def state(self) -> dict:
        try:
            return json.loads((self.data_dir / "devstack.json").read_text())
        except (OSError, ValueError):
            return {}

    def output(self) -> str:
        return (self.data_dir / "devstack.out").read_text(errors="replace")

    async def wait_ready(self, timeout: float = 120) -> dict:
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"devstack exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            return self.state().get("ready")
        try:
            await wait_for(ready, timeout=timeout, interval=0.2, message="devstack ready")
        except TimeoutError:
            raise TimeoutError(f"devstack not ready:\n{self.output()[-4000:]}") from None
        return self.state()

    def stop(self, timeout: float = 60) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


def make_token(role: str, sub: str | None = None, *, secret: str = SECRET, ttl: float = 600,
               org: str | None = None) -> str:
    """A token as the identity provider would sign it; staff and admins belong to `org`
    (TEST_MERCHANT unless given; "" for a token without the claim)."""
    now = int(time.time())
    claims = {"sub": sub or f"{role}-{uuid.uuid4().hex[:8]}", "role": role, "iat": now, "exp": now + int(ttl)}
    if org := org_for(role, org):
        claims["org"] = org
    return jwt.encode(claims, secret, algorithm="HS256")


@pytest.fixture(scope="session")
def devstack_at():
    """devstack_at(dir, **env) -> a started Devstack (stopped at the end of the session)."""
    started: list[Devstack] = []

    def start(data_dir: pathlib.Path, **env) -> Devstack:
        d = Devstack(data_dir, **env).start()
        started.append(d)
        return d
    yield start
    for d in started:
        d.stop()


@pytest_asyncio.fixture(scope="session")
async def stack(devstack_at, tmp_path_factory):
    d = devstack_at(tmp_path_factory.mktemp("cuty-e2e") / "data")
    await d.wait_ready()
    async with httpx.AsyncClient(base_url=d.url, timeout=10) as c:
        await wait_for(lambda: _serving(c), timeout=60, message="gateway /healthz 200")
    return d


async def _serving(c: httpx.AsyncClient) -> bool:
    return (await c.get("/healthz")).status_code == 200


@pytest_asyncio.fixture(scope="session")
async def http(stack):
    async with httpx.AsyncClient(base_url=stack.url, timeout=30, limits=httpx.Limits(max_connections=100)) as c:
        yield c


@pytest.fixture(scope="session")
def auth():
    """auth(role, sub=None, **headers) -> headers with a fresh token (a new subject unless given)."""
    def headers(role: str, sub: str | None = None, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {make_token(role, sub)}", **{k.replace("_", "-"): v for k, v in extra.items()}}
    return headers


def idem() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


@pytest.fixture(scope="session")
def fresh_key():
    return idem


# Test data through the public API ----------------------------------------------------------------

@pytest_asyncio.fixture(scope="session")
async def salon(http, auth) -> str:
    r = await http.post("/v1/salons", json={"name": "E2E Salon", "timeZone": "Europe/Istanbul"}, headers=auth("admin"))
    assert r.status_code == 200, r.text
    return r.json()["id"]


@pytest.fixture(scope="session")
def new_slots(http, auth, salon):
    """new_slots(n) -> n one-hour slots of a new stylist, tomorrow from 09:00 Istanbul time."""
    import datetime as dt
    from zoneinfo import ZoneInfo

    async def make(n: int = 1, days_ahead: int = 1) -> list[dict]:
        admin = auth("admin")
        res = await http.post(f"/v1/salons/{salon}/resources", json={"name": f"stylist {uuid.uuid4().hex[:6]}"}, headers=admin)
        assert res.status_code == 200, res.text
        zone = ZoneInfo("Europe/Istanbul")
        day = dt.datetime.now(zone).date() + dt.timedelta(days=days_ahead)
        slots = []
        for i in range(n):
            start = dt.datetime(day.year, day.month, day.day, 9 + i, tzinfo=zone)
            slots.append({"resourceId": res.json()["id"], "startTime": start.isoformat(),
                          "endTime": (start + dt.timedelta(hours=1)).isoformat(),
                          "price": {"currencyCode": "TRY", "amountMinor": "75000"}})
        r = await http.post(f"/v1/salons/{salon}/slots:batchCreate", json={"slots": slots}, headers=admin)
        assert r.status_code == 200, r.text
        return r.json()["slots"]
    return make


@pytest.fixture(scope="session")
def new_product(http, auth):
    """new_product(codes) -> (product, the imported code values)."""
    async def make(codes: int = 5) -> tuple[dict, list[str]]:
        admin = auth("admin")
        p = await http.post("/v1/products", json={"sku": f"E2E-{uuid.uuid4().hex[:10]}", "name": "E2E gift card",
                                                  "price": {"currencyCode": "TRY", "amountMinor": "10000"}}, headers=admin)
        assert p.status_code == 200, p.text
        values = [f"E2E-{uuid.uuid4().hex[:12].upper()}" for _ in range(codes)]
        r = await http.post(f"/v1/products/{p.json()['id']}/codes:import", json={"batchRef": uuid.uuid4().hex, "codes": values},
                            headers=admin)
        assert r.status_code == 200, r.text
        return p.json(), values
    return make


TERMINAL = {"COMPLETED", "FAILED", "REFUNDED", "EXPIRED", "CANCELLED", "REJECTED"}


def state_of(checkout: dict) -> str:
    return checkout["state"].removeprefix("CHECKOUT_STATE_")


async def buy_booking(http, me: dict, fresh_key, until_state, slot: str) -> dict:
    """Create and pay a checkout of `slot` as `me` through the gateway; the COMPLETED checkout."""
    co = await http.post("/v1/checkouts", json={"slotId": slot}, headers={**me, **fresh_key()})
    assert co.status_code == 200, co.text
    paid = await http.post(f"/v1/checkouts/{co.json()['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                           headers={**me, **fresh_key()})
    assert paid.status_code == 200, paid.text
    done = await until_state(co.json()["id"], me)
    assert state_of(done) == "COMPLETED", done
    return done


@pytest.fixture(scope="session")
def until_state(http):
    """until_state(checkout_id, headers, {states}) -> the checkout once its state is one of them."""
    async def wait(checkout_id: str, headers: dict, states=frozenset(TERMINAL), timeout: float = 30) -> dict:
        last = {}

        async def check():
            nonlocal last
            r = await http.get(f"/v1/checkouts/{checkout_id}", headers=headers)
            assert r.status_code == 200, r.text
            last = r.json()
            return state_of(last) in states
        try:
            await wait_for(check, timeout=timeout, interval=0.1, message=f"checkout in {sorted(states)}")
        except TimeoutError:
            raise AssertionError(f"checkout {checkout_id} stuck: {last}") from None
        return last
    return wait


@pytest.fixture(scope="session")
def token():
    """token(role, sub=None, secret=SECRET, ttl=600) -> a JWT (other secrets and ttls for auth tests)."""
    return make_token
