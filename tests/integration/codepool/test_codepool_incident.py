"""The code pool's incident story on a real database: "the code never arrived" and "the same code
sold twice", answered from whatever support has (a value, a code id, an order id), every lookup
audited; the chargeback evidence RPC is the orchestrator's alone."""
import asyncio
import base64
import json
import os
import subprocess
import sys
import uuid

import asyncpg
import grpc
import pytest
import pytest_asyncio

from codepool.incident import look_up
from cuty.codepool.v1 import codepool_pb2 as pb, codepool_pb2_grpc
from cutylib.config import with_database
from cutylib.db import migrate
from cutylib.testing.ids import new_id
from cutylib.testing.procs import PYTHONPATH, REPO
from cutylib.testing.trust import channel_as

from codepool_testkit import ADMIN, customer, new_product, reserve_request, stocked_product


async def a_code_sold_after_a_release(stub):
    """One code: reserved by a first order that is released, then sold to a second buyer, who reads
    it, and revealed by an admin. Its value is also imported under a second product."""
    product_id, (value,) = await stocked_product(stub, 1)
    first = await stub.ReserveCodes(reserve_request(product_id, customer_id="ann"))
    await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=first.order_id))
    second = await stub.ReserveCodes(reserve_request(product_id, customer_id="bob"))
    assert list(second.code_ids) == list(first.code_ids)
    await stub.DeliverCodes(pb.DeliverCodesRequest(order_id=second.order_id, payment_transaction_id="pay-" + new_id()))
    await stub.GetDeliveredCodes(pb.GetDeliveredCodesRequest(order_id=second.order_id, customer_id="bob"))
    await stub.RevealCode(pb.RevealCodeRequest(code_id=second.code_ids[0]), metadata=ADMIN)
    other = await new_product(stub)
    await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=other, batch_ref="again-" + new_id(), codes=[value]),
                               metadata=ADMIN)
    return value, first, second, other


async def lookups_audited(cp_pool, code_id: str, by: str) -> list:
    return await cp_pool.fetch(
        "SELECT actor, details FROM audit_log WHERE action = 'operator_read' AND actor = $1 AND code_ids @> ARRAY[$2::uuid]"
        " ORDER BY id", f"ops:{by}", uuid.UUID(code_id))


async def test_a_code_is_found_by_value_id_or_order_and_told_whole(stub, cp_service_pool, cp_pool, keyring):
    value, first, second, other = await a_code_sold_after_a_release(stub)
    code_id = second.code_ids[0]
    by = "oncall-" + new_id()[:8]

    story = await look_up(cp_service_pool, keyring, f"  {value} ", by=by)
    assert story.matched == "code value"
    # The same value under two products: two codes, each sellable once (how one value reaches two buyers).
    assert {c.code["product_id"] for c in story.codes} == {second.product_id, other}
    (told,) = [c for c in story.codes if c.code["id"] == code_id]
    assert told.code["status"] == "delivered" and told.code["masked_value"] == "****" + value[-4:]
    assert told.code["reserved_at"] and told.code["delivered_at"] and told.code["batch_ref"].startswith("b-")
    assert [(d["order_id"], d["customer_id"], d["status"]) for d in told.deliveries] == [
        (first.order_id, "ann", "released"), (second.order_id, "bob", "delivered")]
    assert [d["order_status"] for d in told.deliveries] == ["released", "delivered"]
    assert [e["action"] for e in told.reads] == ["read_delivered", "reveal"]
    assert told.reads[0]["details"] == {"customer_id": "bob"}
    assert [(e["action"], e["order_id"]) for e in told.trail] == [
        ("reserve", first.order_id), ("release", first.order_id), ("reserve", second.order_id),
        ("deliver", second.order_id), ("read_delivered", second.order_id), ("reveal", None)]
    # The lookup itself is in the audit log, once per product shown, never with the value.
    audited = await lookups_audited(cp_pool, code_id, by)
    assert [json.loads(a["details"]) if isinstance(a["details"], str) else a["details"] for a in audited] == [
        {"rpc": "ops code (by code value)", "subject": by, "role": "operator"}]
    assert value not in json.dumps(story.to_json())

    for query, matched in ((code_id, "code id"), (second.order_id, "order id")):
        again = await look_up(cp_service_pool, keyring, query, by=by)
        assert again.matched == matched and [c.code["id"] for c in again.codes] == [code_id]
        assert again.codes[0].deliveries == told.deliveries
    assert (await look_up(cp_service_pool, keyring, second.order_id, by=by)).order["customer_id"] == "bob"
    assert len(await lookups_audited(cp_pool, code_id, by)) == 4  # by value, id, order, order


async def test_an_order_that_never_got_a_code_and_a_value_nobody_has(stub, cp_service_pool, cp_pool, keyring):
    product_id, _ = await stocked_product(stub, 1)
    order = await stub.ReserveCodes(reserve_request(product_id))
    await stub.ReleaseReservation(pb.ReleaseReservationRequest(order_id=order.order_id))
    story = await look_up(cp_service_pool, keyring, order.order_id, by="carol")
    assert story.matched == "order id" and story.order["status"] == "released"
    assert story.order["release_reason"] == "released" and len(story.codes) == 1
    before = await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE actor = 'ops:dave'")
    nothing = await look_up(cp_service_pool, keyring, "NO-SUCH-CODE-" + new_id(), by="dave")
    assert nothing.matched == "" and nothing.codes == [] and nothing.order is None
    assert await cp_pool.fetchval("SELECT count(*) FROM audit_log WHERE actor = 'ops:dave'") == before


async def test_the_command_line_prints_the_story(stub, codepool_service_dsn, cp_pool, keyring):
    value, first, second, _ = await a_code_sold_after_a_release(stub)
    keys = ",".join(f"{k}:{base64.b64encode(v).decode()}" for k, v in keyring.keys.items())
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "CUTY_CODEPOOL_DATABASE_URL": codepool_service_dsn,
           "CUTY_CODE_KEYS": f"{keys};active={keyring.active};hash={base64.b64encode(keyring.hash_key).decode()}"}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "codepool", "ops", "code", *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=60)

    out = await asyncio.to_thread(run, value, "--by", "erin")
    assert out.returncode == 0, out.stderr
    assert "THE SAME VALUE IS STORED AS SEVERAL CODES" in out.stdout
    assert f"python -m payments ops story {second.order_id}" not in out.stdout  # a value names no order
    for fact in (second.code_ids[0], first.order_id, "customer ann", "customer bob", "read_delivered", "reveal",
                 "****" + value[-4:]):
        assert fact in out.stdout, fact
    assert value not in out.stdout
    by_order = await asyncio.to_thread(run, second.order_id, "--by", "erin", "--json")
    assert by_order.returncode == 0 and json.loads(by_order.stdout)["order"]["customer_id"] == "bob"
    missing = await asyncio.to_thread(run, "NO-SUCH-" + new_id(), "--by", "erin")
    assert missing.returncode == 1 and "nothing found" in missing.stdout
    assert (await asyncio.to_thread(run, value)).returncode == 2  # --by is required
    assert len(await lookups_audited(cp_pool, second.code_ids[0], "erin")) == 2


async def test_order_evidence_is_for_the_orchestrator_alone(stub, cp_server, cp_pool):
    _, _, second, _ = await a_code_sold_after_a_release(stub)
    ask = pb.GetOrderEvidenceRequest(order_id=second.order_id, requested_by="frank")
    addr = f"127.0.0.1:{cp_server.port}"
    async with channel_as("payments", addr, "codepool") as orchestrator, channel_as("gateway", addr, "codepool") as gw:
        evidence = json.loads((await codepool_pb2_grpc.CodePoolServiceStub(orchestrator).GetOrderEvidence(ask)).document_json)
        assert evidence["order"]["customer_id"] == "bob" and evidence["order"]["status"] == "delivered"
        (code,) = evidence["codes"]
        assert code["id"] == second.code_ids[0] and code["masked_value"].startswith("****")
        assert [e["action"] for e in evidence["order_trail"]] == ["reserve", "deliver", "read_delivered"]
        refused = [
            (codepool_pb2_grpc.CodePoolServiceStub(gw).GetOrderEvidence(ask), grpc.StatusCode.PERMISSION_DENIED),
            (codepool_pb2_grpc.CodePoolServiceStub(orchestrator).GetOrderEvidence(ask, metadata=ADMIN),
             grpc.StatusCode.PERMISSION_DENIED),
            (codepool_pb2_grpc.CodePoolServiceStub(orchestrator).GetOrderEvidence(
                pb.GetOrderEvidenceRequest(order_id=second.order_id)), grpc.StatusCode.INVALID_ARGUMENT),
            (codepool_pb2_grpc.CodePoolServiceStub(orchestrator).GetOrderEvidence(
                pb.GetOrderEvidenceRequest(order_id="ord-" + new_id(), requested_by="frank")), grpc.StatusCode.NOT_FOUND),
        ]
        for call, code_expected in refused:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == code_expected
    assert len(await lookups_audited(cp_pool, second.code_ids[0], "frank")) == 1


@pytest_asyncio.fixture(scope="module")
async def plans_pool(pg):
    """The code pool's schema in a database of its own, never written or analyzed: the plans below
    then depend on the statements and the indexes alone, not on what the session's other tests left
    in the shared database (their rows and the statistics autovacuum took of them)."""
    name = "cuty_codepool_plans_" + uuid.uuid4().hex[:8]
    dsn = with_database(pg.dsn, name)
    await migrate(dsn, REPO / "services" / "codepool" / "migrations")
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    yield pool
    await pool.close()
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.mark.parametrize("statement, index", [("DELIVERIES", "deliveries_by_code"), ("TRAIL", "audit_log_by_code"),
                                              ("FIND_BY_HASH", "Index Only Scan using codes_merchant_product_code_hash_key")])
async def test_the_story_reads_through_its_indexes(plans_pool, statement, index):
    """A code's history is found by index on tables that grow with every sale (migrations 0080, 0081),
    and the products holding a value by an index-only probe each."""
    import codepool.incident as incident

    async with plans_pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        args = {"DELIVERIES": ("m", uuid.uuid4(), 10), "TRAIL": ("m", uuid.uuid4(), ["o"], 10),
                "FIND_BY_HASH": (b"h" * 32, 10)}[statement]
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + getattr(incident, statement), *args))
        names = {index}
        if statement == "TRAIL":  # audit_log is partitioned by time: its index is read through the partitions' own
            names |= {r[0] for r in await conn.fetch(
                "SELECT i.inhrelid::regclass::text FROM pg_inherits i WHERE i.inhparent = $1::regclass", index)}
    assert any(name in plan for name in names) and "Seq Scan" not in plan, plan
