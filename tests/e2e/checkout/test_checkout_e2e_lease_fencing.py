"""A lease holder frozen with SIGSTOP past its lease: another replica takes the lease over and
finishes the payment; after SIGCONT the frozen replica's write is fenced by the version token.

The payment is a checkout's, charged by the saga (pm_card_no_webhook: processing until reconciled).
The frozen replica runs with CUTY_TEST_PAUSE_AFTER_LEASE_MS, so it stops between reading the
version (under its lease) and writing; the test freezes it exactly there, seen in its log.
"""
import json
import uuid

from cuty.payments.v1 import checkout_pb2 as cpb
from cutylib.testing.procs import ServiceProcess, free_port, wait_for

from checkout_e2e import name, start_stack

ENV = {"CUTY_LEASE_SECONDS": 1, "CUTY_RECONCILE_AFTER_SECONDS": 0.3, "CUTY_PAYMENTS_POLL_SECONDS": 0.1,
       "CUTY_PSP_TIMEOUT_SECONDS": 1}


def log_lines(proc: ServiceProcess, msg: str, payment_id: str) -> list[dict]:
    out = []
    for line in proc.tail(2_000_000).splitlines():
        if payment_id in line and msg in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


async def test_sigstopped_lease_holder_is_taken_over_and_fenced(pg, tmp_path):
    shop = await start_stack(pg, tmp_path, service_env={"payments-0": {"CUTY_TEST_PAUSE_AFTER_LEASE_MS": 4000}}, **ENV)
    stack = shop.stack
    frozen = stack.procs["payments-0"]
    db = shop.db["payments"]
    rescuer: ServiceProcess | None = None
    try:
        customer = f"cust-{uuid.uuid4().hex[:8]}"
        (slot,) = await shop.new_slots(1, price=500)
        created = await shop.create(customer, slot=slot)
        paid = await shop.pay(customer, created.id, "pm_card_no_webhook")
        assert paid.state == cpb.CHECKOUT_STATE_CHARGING, name(paid.state)
        pid = await db.fetchval("SELECT id::text FROM payments WHERE checkout_id = $1", uuid.UUID(created.id))
        assert await db.fetchval("SELECT status FROM payments WHERE id = $1", uuid.UUID(pid)) == "processing"

        # Its reconciler leased the payment, read version 2, and now waits before writing: freeze it.
        await wait_for(lambda: log_lines(frozen, "pausing between lease and write", pid), timeout=15,
                       message="the lease holder pausing before its write")
        frozen.pause()
        row = await db.fetchrow("SELECT status, version, lease_owner FROM payments WHERE id = $1", pid)
        assert (row["status"], row["version"]) == ("processing", 2)
        assert row["lease_owner"].split(":")[1] == str(frozen.proc.pid)

        port = free_port()
        env = stack.common_env()
        env["CUTY_PAYMENTS_GRPC_PORT"] = str(port)
        rescuer = ServiceProcess("payments", env, tmp_path / "logs" / "payments-rescuer.log", grpc_port=port).start()
        await rescuer.wait_healthy(60)

        async def finished():
            r = await db.fetchrow("SELECT status, version FROM payments WHERE id = $1", pid)
            return r if r["status"] == "succeeded" else None
        done = await wait_for(finished, timeout=20, message="the other replica finishing the payment")
        assert done["version"] == 3
        assert log_lines(rescuer, "took over an expired payment lease", pid)

        frozen.resume()
        await wait_for(lambda: log_lines(frozen, "version conflict", pid), timeout=15,
                       message="the woken replica's write fenced by the version token")
        events = await db.fetch("SELECT source, to_status, version, note FROM payment_events"
                                " WHERE payment_id = $1 AND source <> 'saga' ORDER BY seq", pid)  # the payment's own
        assert [(e["to_status"], e["version"]) for e in events] == [("created", 1), ("processing", 2), ("succeeded", 3)]
        assert events[-1]["source"] == "reconcile"
        assert f":{rescuer.proc.pid}:" in events[-1]["note"]  # written by the rescuer, not the frozen one
        final = await db.fetchrow("SELECT status, version FROM payments WHERE id = $1", pid)
        assert (final["status"], final["version"]) == ("succeeded", 3)
    finally:
        frozen.resume()
        if rescuer is not None:
            rescuer.stop()
        await shop.close()
