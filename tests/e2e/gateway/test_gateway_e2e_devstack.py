"""`make run`'s supervisor: demo data once, a crashed service restarted, SIGTERM stops everything
(Postgres included), and a second start reuses the data without duplicating the demo."""
import datetime as dt
import json
import os
import pathlib
import shlex
import signal
import subprocess

import httpx

from cutylib.testing.procs import wait_for

REPO = pathlib.Path(__file__).resolve().parents[3]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def demo_counts(url: str, demo: dict, headers: dict) -> tuple[int, str]:
    """Counted by the platform's operator: the demo's product belongs to the demo merchant,
    and a test admin (TEST_MERCHANT) would see NOT_FOUND."""
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    listed, token = 0, ""
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as c:
        while True:  # ListSlots is paged
            slots = await c.get(f"/v1/salons/{demo['salon_id']}/slots", params={
                "startTime": now.isoformat(), "endTime": (now + dt.timedelta(days=9)).isoformat(),
                "pageToken": token})
            assert slots.status_code == 200, slots.text
            listed += len(slots.json()["slots"])
            token = slots.json().get("nextPageToken")
            if not token:
                break
        stock = await c.get(f"/v1/products/{demo['product_id']}/stock")
    assert stock.status_code == 200, stock.text
    return listed, stock.json()["available"]


async def test_devstack_lifecycle(devstack_at, tmp_path, auth):
    data = tmp_path / "data"
    first = devstack_at(data)
    state = await first.wait_ready()
    demo = state["demo"]
    assert demo["slots"] == 126 and demo["codes"] == 200
    assert await demo_counts(first.url, demo, auth("operator")) == (126, "200")
    out = first.output()
    # a token per role is printed, staff and admins one per demo merchant
    assert all(f"{role} " in out for role in ("customer", "operator"))
    assert all(f"{role}@{m} " in out for role in ("staff", "admin") for m in ("demo-salons", "demo-shop"))

    # A crashed service is reported and restarted.
    old = state["children"]["booking"]
    os.kill(old, signal.SIGKILL)
    await wait_for(lambda: first.state()["children"]["booking"] != old, timeout=30, message="booking restarted")
    async with httpx.AsyncClient(base_url=first.url, timeout=5) as c:
        await wait_for(lambda: _ok(c), timeout=30, message="healthy again")
    assert "booking exited with code -9" in first.output()

    # SIGTERM stops every process and Postgres.
    children = first.state()["children"].values()
    pg_port = int(first.env["CUTY_PG_PORT"])
    assert first.stop() == 0
    assert not any(alive(pid) for pid in children)
    if not os.environ.get("CUTY_TEST_DSN"):  # the embedded cluster (else the test server is not ours)
        # Postgres removes postmaster.pid once shut down (a port probe could hit another process).
        assert (data / "pg" / "PG_VERSION").exists() and not (data / "pg" / "postmaster.pid").exists()

    # The second run reuses the data: same demo ids, nothing added.
    second = devstack_at(data, CUTY_PG_PORT=str(pg_port))
    again = (await second.wait_ready())["demo"]
    assert again == demo
    assert "demo data present" in second.output()
    assert await demo_counts(second.url, demo, auth("operator")) == (126, "200")

    # The banner's internal client (docs/clients.md): the example till, with the certificate
    # `make run` issued it, books a slot and sells a code as itself, and a code for a customer.
    command = [line.strip() for line in second.output().splitlines() if "examples/pos_checkout.py" in line][-1]
    customer = auth("customer")["Authorization"].removeprefix("Bearer ")
    run = subprocess.run(shlex.split(command.replace("$TOKEN", customer)), cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    steps = [json.loads(line) for line in run.stdout.splitlines()]
    # With a JWT secret of its own (as here) the till forwards no tokens: the services verify
    # forwarded tokens with the development secret only (the gateway alone holds a real one).
    forwards = "$TOKEN" in command
    assert [s["step"] for s in steps] == ["slot", "code"] + (["code-for-customer"] if forwards else [])
    assert all(s["outcome"] in ("COMPLETED", "CHARGING", "CONFIRMING") for s in steps), steps
    assert second.stop() == 0


async def _ok(c: httpx.AsyncClient) -> bool:
    try:
        return (await c.get("/healthz")).status_code == 200
    except httpx.HTTPError:
        return False
