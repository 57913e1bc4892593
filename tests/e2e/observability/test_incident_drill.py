"""The incident drill, with real processes (PSP simulator, booking, code pool, payments,
the gateway): the PSP refuses every refund; a 3-D Secure payment completes after its hold ran out
and someone else took the slot (a late capture), so the saga must refund, and cannot.

Then, as on call: payments' /metrics shows the refund retries, the saga stuck in REFUNDING and then
NEEDS_ATTENTION; those scraped series, fed to `promtool test rules` with the real rule file, fire
CheckoutRefundsFailing, CheckoutSagaStuck and CheckoutNeedsAttention; `python -m payments ops story
<PSP intent id>` (the CLI, in a process of its own with the payments identity) names the failing
step, its error and the checkout's trace id (with a link); staff see the same over HTTP. The fix:
the PSP recovers, `ops retry --by` puts the saga back, and it ends REFUNDED, recorded with who.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid

import asyncpg
import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from booking.grpc_api import CALLERS as BOOKING_CALLERS
from cuty.booking.v1 import booking_pb2 as bpb, booking_pb2_grpc
from cutylib.config import DEV_JWT_SECRET, with_database
from cutylib.demo import _auth
from cutylib.testing.procs import wait_for
from cutylib.testing.stack import Stack
from cutylib.testing.trust import TEST_MERCHANT, acting_channel
from observability_names import RULES
from test_one_trace_per_checkout import slot_checkout_paid

PROMTOOL = shutil.which("promtool")
TRACE_TEMPLATE = "http://jaeger.example:16686/trace/{trace_id}"
MAX_ATTEMPTS = 8


@pytest_asyncio.fixture(scope="module")
async def drill(pg, tmp_path_factory):
    suffix = uuid.uuid4().hex[:8]
    dbs = {s: with_database(pg.dsn, f"cuty_{s}_drill_{suffix}") for s in ("booking", "codepool", "payments")}
    env = {**{f"CUTY_{s.upper()}_DATABASE_URL": d for s, d in dbs.items()},
           "CUTY_HOLD_TTL_SECONDS": 2, "CUTY_HOLD_MAX_EXTENSION_SECONDS": 1, "CUTY_LEASE_SECONDS": 2,
           "CUTY_SAGA_POLL_SECONDS": 0.2, "CUTY_SAGA_RETRY_BASE_SECONDS": 0.3, "CUTY_SAGA_RETRY_CAP_SECONDS": 1,
           "CUTY_SAGA_MAX_ATTEMPTS": MAX_ATTEMPTS, "CUTY_METRICS_REFRESH_SECONDS": 0.25,
           "CUTY_RECONCILE_AFTER_SECONDS": 0.5, "CUTY_PAYMENTS_POLL_SECONDS": 0.1, "CUTY_PSP_TIMEOUT_SECONDS": 0.5,
           "CUTY_PSP_WEBHOOK_RETRY_BASE_SECONDS": 0.05, "CUTY_PSP_WEBHOOK_RETRY_CAP_SECONDS": 0.5,
           "CUTY_PSP_SETTLE_DELAY_MS": 100, "CUTY_SWEEP_INTERVAL_SECONDS": 1}
    stack = Stack(pg.dsn, tmp_path_factory.mktemp("drill"), gateway=True, env=env)
    try:
        await stack.start()
        pools = {s: await asyncpg.create_pool(d, min_size=1, max_size=2) for s, d in dbs.items()}
        stack.drill_dbs, stack.drill_pools = dbs, pools
        yield stack
        for p in pools.values():
            await p.close()
    finally:
        await stack.stop()


async def scrape(port: int) -> dict[tuple[str, tuple], float]:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(f"http://127.0.0.1:{port}/metrics")
    r.raise_for_status()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def sample(scraped: dict, name: str, **labels) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def ops(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    """`python -m payments ops ...` as it runs in the payments pod: the payments identity and database."""
    env = {**stack.procs["payments-0"].env, "CUTY_TRACE_URL_TEMPLATE": TRACE_TEMPLATE}
    return subprocess.run([sys.executable, "-m", "payments", "ops", *args], env=env, capture_output=True,
                          text=True, timeout=60)


async def late_capture(stack: Stack) -> dict:
    """A checkout whose payment is captured after its hold ran out and the slot was taken."""
    me = _auth(DEV_JWT_SECRET, f"drill-{uuid.uuid4().hex[:6]}", "customer")
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=30) as c:
        slot, created, paid = await slot_checkout_paid(c, DEV_JWT_SECRET, me, "pm_card_3ds")
    assert paid.json()["state"].endswith("AWAITING_ACTION"), paid.text
    co = created.json()
    intent = await stack.drill_pools["payments"].fetchval(
        "SELECT psp_intent_id FROM payments WHERE checkout_id = $1", uuid.UUID(co["id"]))
    payments = stack.procs["payments-0"]
    payments.pause()  # the orchestrator is frozen while the hold runs out and 3-D Secure completes
    try:
        await wait_for(lambda: stack.drill_pools["booking"].fetchval(
            "SELECT expires_at < clock_timestamp() FROM holds WHERE id = $1", uuid.UUID(co["holdId"])),
            timeout=10, message="the hold to run out")
        ch = acting_channel(stack.booking_addr, "booking", BOOKING_CALLERS)
        rival = await booking_pb2_grpc.BookingServiceStub(ch).HoldSlot(
            bpb.HoldSlotRequest(slot_id=slot["id"], customer_id="rival", request_id=str(uuid.uuid4())))
        await ch.close()
        assert rival.status == bpb.HOLD_STATUS_HELD
        async with httpx.AsyncClient(timeout=10) as c:
            done = await c.get(f"{stack.psp_url}/3ds/{intent}/complete")
        assert done.json()["status"] == "succeeded"
    finally:
        payments.resume()
    return {**co, "trace_id": created.headers["x-trace-id"], "intent": intent}


def promtool_test(tmp_path, series: dict[str, list[float]], step: dict[str, float], alerts: list[dict]) -> str:
    """A `promtool test rules` file over the real rule file: each series as scraped (one scrape per
    15 s step), then going on as it went (+step per 15 s) for 40 more steps."""
    lines = [f"rule_files:\n  - {RULES}", "evaluation_interval: 15s", "tests:", "  - interval: 15s",
             "    input_series:"]
    for s, values in series.items():
        seen = " ".join(f"{v:g}" for v in values)
        lines += [f"      - series: '{s}'", f"        values: '{seen} {values[-1] + step.get(s, 0):g}+{step.get(s, 0):g}x40'"]
    lines.append("    promql_expr_test:")
    for a in alerts:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted({**a, "alertstate": "firing"}.items()))
        lines += [f"      - expr: 'ALERTS{{alertname=\"{a['alertname']}\",alertstate=\"firing\"}}'",
                  "        eval_time: 10m", "        exp_samples:", f"          - labels: 'ALERTS{{{labels}}}'",
                  "            value: 1"]
    path = tmp_path / "drill.test.yml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


async def test_incident_drill(drill, tmp_path):
    stack = drill
    port = stack.metrics_ports["payments-0"]
    async with httpx.AsyncClient(timeout=5) as c:
        (await c.post(f"{stack.psp_url}/v1/_faults", json={"fail_next_refunds": 100_000})).raise_for_status()
    before = await scrape(port)
    co = await late_capture(stack)

    # 1. The metrics move: the saga retries the refund in REFUNDING, then gives up (NEEDS_ATTENTION).
    RETRIES, SAGAS, AGE = ("cuty_checkout_retries_total", "cuty_checkout_sagas",
                           "cuty_checkout_oldest_saga_age_seconds")
    refunding: list[dict] = []

    async def refund_retried_twice():
        s = await scrape(port)
        if sample(s, SAGAS, state="REFUNDING") >= 1:
            refunding.append(s)
        return sum(sample(x, RETRIES, state="REFUNDING") >= 2 for x in refunding) >= 2 or None
    try:
        await wait_for(refund_retried_twice, timeout=30, interval=0.2, message="refund retries seen in REFUNDING")
    except TimeoutError:
        saga = await stack.drill_pools["payments"].fetchrow(
            "SELECT state, attempts, last_error, next_run_at - clock_timestamp() AS due_in FROM checkouts "
            "WHERE id = $1", uuid.UUID(co["id"]))
        last = await scrape(port)
        seen = {k: v for k, v in last.items() if k[0] in (RETRIES, SAGAS) and v}
        raise AssertionError(f"no refund retried twice in REFUNDING in 30 s ({len(refunding)} scrapes saw it); "
                             f"the saga: {dict(saga) if saga else None}; /metrics: {seen}") from None

    async def needs_attention():
        s = await scrape(port)
        return s if sample(s, SAGAS, state="NEEDS_ATTENTION") >= 1 else None
    after = await wait_for(needs_attention, timeout=40, interval=0.2, message="NEEDS_ATTENTION on /metrics")
    # (cuty_checkout_late_captures_total moves only when the expiry's cancel learns of the capture; when
    # the webhook wins the race the saga goes AWAITING_ACTION -> CONFIRMING -> REFUNDING: either way a refund.)
    assert sample(after, RETRIES, state="REFUNDING") >= MAX_ATTEMPTS - 1
    assert sample(after, "cuty_checkout_sagas_need_attention_total") == 1

    # 2. The alerts fire on those series (promtool, the real rule file).
    if PROMTOOL is None:
        pytest.skip("promtool not found: install the Debian package 'prometheus' (the metrics part passed)")
    refunding = refunding[-8:]  # the last scrapes in REFUNDING, retrying
    retries = [sample(s, RETRIES, state="REFUNDING") for s in refunding]
    per_step = max(1.0, (retries[-1] - retries[0]) / max(1, len(retries) - 1))
    series = {
        'cuty_checkout_retries_total{state="REFUNDING"}': retries,
        'cuty_checkout_sagas{state="REFUNDING"}': [sample(s, SAGAS, state="REFUNDING") for s in refunding],
        'cuty_checkout_oldest_saga_age_seconds{state="REFUNDING"}': [sample(s, AGE, state="REFUNDING") for s in refunding],
    }
    steps = {'cuty_checkout_retries_total{state="REFUNDING"}': per_step,
             'cuty_checkout_oldest_saga_age_seconds{state="REFUNDING"}': 15}
    fired = [{"alertname": "CheckoutRefundsFailing", "severity": "page"},
             {"alertname": "CheckoutSagaStuck", "severity": "page", "state": "REFUNDING"}]
    r = subprocess.run([PROMTOOL, "test", "rules", promtool_test(tmp_path / "", series, steps, fired)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    attention = {'cuty_checkout_sagas{state="NEEDS_ATTENTION"}': [
        sample(before, SAGAS, state="NEEDS_ATTENTION"), sample(after, SAGAS, state="NEEDS_ATTENTION")]}
    (tmp_path / "na").mkdir()
    r = subprocess.run([PROMTOOL, "test", "rules", promtool_test(
        tmp_path / "na", attention, {}, [{"alertname": "CheckoutNeedsAttention", "severity": "page"}])],
        capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

    # 3. On call, with only the PSP intent id from the bank: `ops stuck`, then `ops story`.
    stuck = ops(stack, "stuck", "--older-than", "0")
    assert stuck.returncode == 0 and co["id"] in stuck.stdout and "NEEDS_ATTENTION(from REFUNDING)" in stuck.stdout
    story = ops(stack, "story", co["intent"])
    assert story.returncode == 0, story.stderr
    text = story.stdout
    assert "matched PSP intent id" in text and "failing step: refund" in text
    assert "PSP unavailable while refunding" in text  # its error
    assert co["trace_id"] in text and TRACE_TEMPLATE.replace("{trace_id}", co["trace_id"]) in text
    (data,) = json.loads(ops(stack, "story", co["intent"], "--json").stdout)
    assert data["checkout"]["id"] == co["id"] and data["checkout"]["attention_from"] == "REFUNDING"
    assert data["failing_step"].startswith("refund") and data["trace_ids"][0] == co["trace_id"]
    assert ("CONFIRMING", "REFUNDING") in {(e["from_status"], e["to_status"]) for e in data["timeline"]}

    # ...and staff over HTTP: the payment by its intent id, the checkout with attempts and last error.
    staff = _auth(DEV_JWT_SECRET, "drill-staff", "staff", merchant=TEST_MERCHANT)
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as c:
        found = await c.get("/v1/payments:lookup", params={"pspIntentId": co["intent"]}, headers=staff)
        assert found.status_code == 200, found.text
        assert found.json()["checkoutId"] == co["id"] and found.json()["status"].endswith("SUCCEEDED")
        seen = (await c.get(f"/v1/checkouts/{co['id']}", headers=staff)).json()
        assert seen["diagnostics"]["attempts"] == MAX_ATTEMPTS and "PSP unavailable" in seen["diagnostics"]["lastError"]
        assert seen["diagnostics"]["traceId"] == co["trace_id"]

    # 4. The fix: the PSP recovers; the operator retries; the money goes back, recorded with who.
    async with httpx.AsyncClient(timeout=5) as c:
        (await c.post(f"{stack.psp_url}/v1/_faults", json={"fail_next_refunds": 0})).raise_for_status()
    retried = ops(stack, "retry", co["id"], "--by", "oncall-ayse")
    assert retried.returncode == 0, retried.stderr
    await wait_for(lambda: stack.drill_pools["payments"].fetchval(
        "SELECT state = 'REFUNDED' FROM checkouts WHERE id = $1", uuid.UUID(co["id"])), timeout=20,
        message="REFUNDED after the operator's retry")
    final = ops(stack, "story", co["id"]).stdout
    assert "retried by ops:oncall-ayse" in final and "refunded:" in final
