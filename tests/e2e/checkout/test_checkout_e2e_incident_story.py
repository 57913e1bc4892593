"""The code pool's incident story across real processes: a buyer says "the code never arrived".
`payments ops story` on the checkout points at `codepool ops code`; that finds the code by the value
the buyer reads out (its keyed hash) and shows the order and the buyer's read of it; `payments
evidence` exports one chargeback document joining the payment's timeline with the code pool's part
(over its system-only RPC), and both services record who exported it."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import pytest_asyncio

from cutylib.testing.procs import as_service_role

from checkout_e2e import name, start_stack


@pytest_asyncio.fixture(scope="module")
async def shop(pg, tmp_path_factory):
    s = await start_stack(pg, tmp_path_factory.mktemp("checkout-e2e-incident"))
    yield s
    await s.close()


def run(shop, proc: str, module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m <module> ...` as it runs in that service's pod: its identity, database and keys."""
    env = as_service_role(module, dict(shop.stack.procs[proc].env))
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=60)


async def test_the_code_never_arrived_in_two_minutes(shop, tmp_path):
    product = await shop.new_product(stock=2, price=1500)
    buyer = "cust-" + uuid.uuid4().hex[:8]
    created = await shop.create(buyer, product=product, quantity=1)
    await shop.pay(buyer, created.id, "pm_card_ok")
    done = await shop.until(created.id)
    assert name(done.state) == "COMPLETED"
    (code,) = (await shop.get(created.id, buyer)).codes  # the buyer's page read the code
    value = code.value

    story = await asyncio.to_thread(run, shop, "payments-0", "payments", "ops", "story", created.id)
    assert story.returncode == 0, story.stderr
    assert f"python -m codepool ops code {created.id} --by <you>" in story.stdout

    found = await asyncio.to_thread(run, shop, "codepool", "codepool", "ops", "code", value, "--by", "zoe")
    assert found.returncode == 0, found.stderr
    for fact in (code.id, created.id, f"customer {buyer}", "delivered", "read_delivered"):
        assert fact in found.stdout, (fact, found.stdout)
    assert value not in found.stdout

    exported = await asyncio.to_thread(run, shop, "payments-0", "payments", "evidence", created.id,
                                       "--by", "zoe", "--out", str(tmp_path))
    assert exported.returncode == 0, exported.stderr
    text = (tmp_path / f"{created.id}.json").read_text()
    assert value not in text
    doc = json.loads(text)
    assert doc["schema"] == "cuty.chargeback-evidence/1" and doc["generated_by"] == "ops:zoe"
    assert (doc["order"]["state"], doc["order"]["customer_id"], doc["order"]["kind"]) == ("COMPLETED", buyer, "codes")
    assert [p["status"] for p in doc["payments"]] == ["succeeded"] and doc["refunds"] == []
    assert ("saga", "CHARGING", "COMPLETED") in [(e["source"], e["from_status"], e["to_status"])
                                                   for e in doc["payment_timeline"]]
    assert doc["codes"]["order"]["status"] == "delivered" and doc["codes"]["order"]["customer_id"] == buyer
    (told,) = doc["codes"]["codes"]
    assert told["id"] == code.id and told["masked_value"] == "****" + value[-4:]
    assert [(r["action"], r["details"].get("customer_id")) for r in told["reads"]][:1] == [("read_delivered", buyer)]
    assert "deliver" in [e["action"] for e in doc["codes"]["order_trail"]]

    # Both services recorded who looked: payments' operator reads, the code pool's audit log.
    assert await shop.db["payments"].fetchval(
        "SELECT count(*) FROM operator_reads WHERE subject = 'ops:zoe' AND rpc = 'chargeback evidence' "
        "AND object_id = $1", created.id) == 1
    assert [r["rpc"] for r in await shop.db["codepool"].fetch(
        "SELECT details->>'rpc' AS rpc FROM audit_log WHERE action = 'operator_read' AND actor = 'ops:zoe' ORDER BY id")] == [
        "ops code (by code value)", "chargeback evidence"]

    nothing = await asyncio.to_thread(run, shop, "payments-0", "payments", "evidence", str(uuid.uuid4()), "--by", "zoe")
    assert nothing.returncode == 1 and "no order found" in nothing.stderr
