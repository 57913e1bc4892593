"""Outbound events for merchants. The outbox (merchant_events) is written with the
checkout's state change and never without it; admins register webhook endpoints (merchant-scoped);
delivery workers POST signed events to a real local receiver at least once, retry with back-off,
never run one delivery twice at the same time, and an admin can redeliver."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

import asyncpg
import pytest

from cutylib.testing.postgres import owner_connection
from cutylib import errors
from cutylib.principal import Principal
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import TEST_MERCHANT
from payments import signature
from payments.checkout.domain import validate_create
from payments.outbound.service import validate_url
from cutylib.backoff import equal_jitter as backoff
from payments.outbound.worker import DeliveryWorker

from hostile_endpoint import HostileEndpoint, RssPeak
from outbound_testkit import FAST
from webhook_receiver import Receiver

pytestmark = pytest.mark.usefixtures("clean_endpoints")

C = "customer-" + uuid.uuid4().hex[:8]
ADMIN = Principal("admin-1", "admin", TEST_MERCHANT)
OTHER_ADMIN = Principal("admin-2", "admin", "merchant-other-" + uuid.uuid4().hex[:6])


async def buy_booking(h) -> str:
    created = await h.service.create(C, validate_create(h.booking.add_slot(price=12345), "", 0), "")
    await h.service.pay(C, created.id, "pm_card_ok", "")
    return created.id


async def buy_codes(h) -> str:
    pid = h.codepool.add_product(price=2500, stock=5)
    created = await h.service.create(C, validate_create("", pid, 2), "")
    await h.service.pay(C, created.id, "pm_card_ok", "")
    return created.id


async def events_of(h, checkout_id):
    return await h.pool.fetch("SELECT * FROM merchant_events WHERE checkout_id = $1 ORDER BY type", uuid.UUID(checkout_id))


def _j(value):
    return json.loads(value) if isinstance(value, str) else value


async def run_workers(pool, n: int, options=FAST):
    workers = [DeliveryWorker(pool, f"test-worker-{i}", options) for i in range(n)]
    return workers, [asyncio.create_task(w.run()) for w in workers]


async def settled(pool, timeout: float = 20.0) -> None:
    """Until no delivery is pending (the receiver may hear an event before its result is written)."""
    async def none_pending():
        return not await pool.fetchval("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'")
    await wait_for(none_pending, timeout=timeout, message="no delivery pending")


async def stop(tasks):
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- the outbox ---------------------------------------------------------------------------------

async def test_a_completed_booking_writes_its_events_in_the_state_change(harness, endpoints):
    h = harness
    ep = await endpoints.create(ADMIN, "https://hooks.example.com/cuty", ["checkout.completed"])
    cid = await buy_booking(h)
    row = await h.row(cid)
    assert row["state"] == "COMPLETED"
    evs = await events_of(h, cid)
    assert [e["type"] for e in evs] == ["booking.confirmed", "checkout.completed"]
    for e in evs:
        p = _j(e["payload"])
        assert p["id"] == str(e["id"]) and p["type"] == e["type"] and p["merchant_id"] == TEST_MERCHANT
        ck = p["data"]["checkout"]
        assert ck["id"] == cid and ck["kind"] == "booking" and ck["state"] == "COMPLETED"
        assert ck["amount"] == {"amount_minor": 12345, "currency_code": "TRY"}
        assert ck["slot_id"] == str(row["slot_id"]) and ck["payment_id"] == str(row["payment_id"])
        assert "customer_id" not in ck and "client_secret" not in json.dumps(_j(e["payload"]))
    # one delivery per subscribed (event, endpoint): the endpoint wants checkout.completed only
    deliveries = await h.pool.fetch("SELECT d.*, e.type FROM webhook_deliveries d JOIN merchant_events e "
                                    "ON e.merchant_id = d.merchant_id AND e.id = d.event_id WHERE e.checkout_id = $1",
                                    uuid.UUID(cid))
    assert [(d["type"], str(d["endpoint_id"]), d["state"]) for d in deliveries] == [
        ("checkout.completed", ep.id, "pending")]


async def test_codes_delivered_and_no_event_without_a_state_change(harness):
    h = harness
    cid = await buy_codes(h)
    assert [e["type"] for e in await events_of(h, cid)] == ["checkout.completed", "codes.delivered"]
    payload = _j((await events_of(h, cid))[1]["payload"])
    assert payload["data"]["checkout"]["quantity"] == 2
    assert "codes" not in payload["data"]["checkout"]  # never a code value
    # a declined purchase ends FAILED: no event; a HELD one: none yet
    created = await h.service.create(C, validate_create(h.booking.add_slot(price=100), "", 0), "")
    assert await events_of(h, created.id) == []
    await h.service.pay(C, created.id, "pm_card_declined", "")
    assert (await h.row(created.id))["state"] == "FAILED"
    assert await events_of(h, created.id) == []


async def test_a_rolled_back_state_change_leaves_no_event_and_an_event_cannot_be_forged_or_erased(harness):
    h = harness
    cid = await buy_codes(h)
    before = await h.pool.fetchval("SELECT count(*) FROM merchant_events")
    # The COMPLETED transition of a CONFIRMING row, rolled back: the event goes with it.
    created = await h.service.create(C, validate_create(h.booking.add_slot(price=100), "", 0), "")
    async with h.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("UPDATE checkouts SET state = 'CHARGING', version = version + 1, payment_key = gen_random_uuid() "
                           "WHERE id = $1", uuid.UUID(created.id))
        await conn.execute("UPDATE checkouts SET state = 'CONFIRMING', version = version + 1 WHERE id = $1",
                           uuid.UUID(created.id))
        await conn.execute("UPDATE checkouts SET state = 'COMPLETED', version = version + 1, next_run_at = NULL, "
                           "lease_owner = NULL, lease_until = NULL WHERE id = $1", uuid.UUID(created.id))
        assert await conn.fetchval("SELECT count(*) FROM merchant_events WHERE checkout_id = $1",
                                   uuid.UUID(created.id)) == 2
        await tx.rollback()
    assert await h.pool.fetchval("SELECT count(*) FROM merchant_events") == before
    # events are history
    with pytest.raises(asyncpg.PostgresError):
        await h.pool.execute("DELETE FROM merchant_events WHERE checkout_id = $1", uuid.UUID(cid))
    with pytest.raises(asyncpg.PostgresError):
        await h.pool.execute("UPDATE merchant_events SET type = 'checkout.refunded' WHERE checkout_id = $1",
                             uuid.UUID(cid))


async def test_a_refund_after_capture_is_a_checkout_refunded_event(harness):
    """A booking whose hold was lost while 3-D Secure dragged on: the saga refunds (REFUNDED)."""
    h = harness
    created = await h.service.create(C, validate_create(h.booking.add_slot(price=500), "", 0), "")
    row = await h.row(created.id)
    # Drive the row to REFUNDED through the transition table (the saga's refund path is covered by
    # the saga tests; here only what the outbox writes for it matters).
    async with h.pool.acquire() as conn:
        for state in ("CHARGING", "CONFIRMING", "REFUNDING"):
            await conn.execute("UPDATE checkouts SET state = $2, version = version + 1, "
                               "payment_key = COALESCE(payment_key, gen_random_uuid()) WHERE id = $1",
                               row["id"], state)
        await conn.execute("UPDATE checkouts SET state = 'REFUNDED', version = version + 1, next_run_at = NULL, "
                           "lease_owner = NULL, lease_until = NULL WHERE id = $1", row["id"])
    assert [e["type"] for e in await events_of(h, created.id)] == ["checkout.refunded"]


# -- endpoints ----------------------------------------------------------------------------------

async def test_endpoint_crud_secret_once_and_merchant_isolation(endpoints):
    ep = await endpoints.create(ADMIN, "https://hooks.example.com/a", ["checkout.completed", "booking.confirmed"])
    assert ep.secret.startswith("whsec_") and len(ep.secret) > 40
    assert ep.merchant_id == TEST_MERCHANT and ep.events == ["checkout.completed", "booking.confirmed"]
    listed = await endpoints.list(ADMIN)
    assert [e.id for e in listed] == [ep.id] and all(e.secret == "" for e in listed)
    # another merchant sees nothing, deletes nothing, lists no deliveries
    assert await endpoints.list(OTHER_ADMIN) == []
    with pytest.raises(errors.NotFound):
        await endpoints.delete(OTHER_ADMIN, ep.id)
    with pytest.raises(errors.NotFound):
        await endpoints.deliveries(OTHER_ADMIN, ep.id, 0, "")
    with pytest.raises(errors.NotFound):
        await endpoints.redeliver(OTHER_ADMIN, ep.id, str(uuid.uuid4()))
    # staff and the operator: no
    for who in (Principal("s", "staff", TEST_MERCHANT), Principal("o", "operator")):
        with pytest.raises(errors.PermissionDenied):
            await endpoints.list(who)
    await endpoints.delete(ADMIN, ep.id)
    assert await endpoints.list(ADMIN) == []
    with pytest.raises(errors.NotFound):
        await endpoints.delete(ADMIN, ep.id)


@pytest.mark.parametrize("url, events, field", [
    ("", ["checkout.completed"], "url"),
    ("http://hooks.example.com/x", ["checkout.completed"], "url"),
    ("ftp://hooks.example.com/x", ["checkout.completed"], "url"),
    ("https://user:pw@hooks.example.com/x", ["checkout.completed"], "url"),
    ("https:///nohost", ["checkout.completed"], "url"),
    ("https://hooks.example.com/x", [], "events"),
    ("https://hooks.example.com/x", ["checkout.exploded"], "events"),
    ("https://hooks.example.com/x", ["checkout.completed"], None),
])
async def test_bad_input_names_the_field(endpoints, url, events, field):
    if field is None:
        await endpoints.create(ADMIN, url, events)
        return
    with pytest.raises(errors.InvalidArgument) as e:
        await endpoints.create(ADMIN, url, events)
    assert e.value.field == field


def test_local_http_only_with_the_development_allowance():
    assert validate_url("http://127.0.0.1:8080/h", "development", allow_private=True)
    assert validate_url("http://localhost/h", "development", allow_private=True)
    for url in ("http://127.0.0.1:8080/h", "https://localhost/h", "https://localhost./h", "https://127.0.0.2/h",
                "https://[::ffff:127.0.0.1]/h", "https://10.1.2.3/h", "https://169.254.169.254/latest"):
        for env in ("development", "production"):
            with pytest.raises(errors.InvalidArgument):
                validate_url(url, env)
    with pytest.raises(errors.InvalidArgument):
        validate_url("http://hooks.example.com/h", "development", allow_private=True)  # http: local only
    # production: port 443 only
    assert validate_url("https://hooks.example.com/h", "production")
    assert validate_url("https://hooks.example.com:443/h", "production")
    with pytest.raises(errors.InvalidArgument):
        validate_url("https://hooks.example.com:8443/h", "production")


def test_backoff_grows_exponentially_with_jitter_and_is_capped():
    import random

    rng = random.Random(7)
    waits = [backoff(n, 10, 3600, rng) for n in range(1, 20)]
    assert 5 <= waits[0] <= 10 and 10 <= waits[1] <= 20 and 20 <= waits[2] <= 40
    assert all(1800 <= w <= 3600 for w in waits[12:])
    assert len({round(w, 6) for w in waits}) == len(waits)  # jittered


# -- delivery -----------------------------------------------------------------------------------

async def test_signed_events_reach_a_real_receiver_at_least_once_then_a_500_is_retried(harness, endpoints):
    h = harness
    async with Receiver(fail_first=2) as rx:
        ep = await endpoints.create(ADMIN, rx.url, ["checkout.completed", "booking.confirmed", "codes.delivered"])
        rx.secrets.append(ep.secret)
        _, tasks = await run_workers(h.pool, 1)
        try:
            ids = [await buy_booking(h), await buy_codes(h)]
            await rx.until(lambda evs: len(evs) == 4)
            await settled(h.pool)
        finally:
            await stop(tasks)
    got = {(e["data"]["checkout"]["id"], e["type"]) for e in rx.events.values()}
    assert got == {(ids[0], "checkout.completed"), (ids[0], "booking.confirmed"),
                   (ids[1], "checkout.completed"), (ids[1], "codes.delivered")}
    assert rx.rejected == 0 and len(rx.requests) >= 6  # two 500s, retried
    for r in rx.requests:
        assert r["headers"]["content-type"] == "application/json"
        signature.verify(r["headers"]["cuty-signature"], r["body"], [ep.secret])
    rows = await h.pool.fetch("SELECT * FROM webhook_deliveries WHERE endpoint_id = $1", uuid.UUID(ep.id))
    assert len(rows) == 4 and all(r["state"] == "delivered" and r["lease_owner"] is None for r in rows)
    # the delivery log: every attempt, the failed ones with their status
    log, token = await endpoints.deliveries(ADMIN, ep.id, 0, "")
    assert token == "" and len(log) == 4
    attempts = [a for d in log for a in d.attempt_log]
    assert sorted(a["http_status"] for a in attempts) == [204, 204, 204, 204, 500, 500]
    retried = [d for d in log if d.attempts > 1]
    assert retried and all(d.attempt_log[-1]["http_status"] == 204 for d in retried)
    page, token = await endpoints.deliveries(ADMIN, ep.id, 3, "")
    rest, end = await endpoints.deliveries(ADMIN, ep.id, 3, token)
    assert [d.id for d in page + rest] == [d.id for d in log] and end == ""


async def test_a_receiver_that_keeps_failing_backs_off_then_the_delivery_fails_and_is_redelivered(harness, endpoints):
    h = harness
    async with Receiver(fail_first=10_000) as rx:
        ep = await endpoints.create(ADMIN, rx.url, ["checkout.completed"])
        rx.secrets.append(ep.secret)
        cid = await buy_codes(h)
        # a short retry window: the delivery gives up after about a second
        await h.pool.execute("UPDATE webhook_deliveries SET give_up_at = clock_timestamp() + interval '1 second' "
                             "WHERE endpoint_id = $1", uuid.UUID(ep.id))
        _, tasks = await run_workers(h.pool, 1)
        try:
            async def failed():
                return await h.pool.fetchval("SELECT state FROM webhook_deliveries WHERE endpoint_id = $1",
                                             uuid.UUID(ep.id)) == "failed"
            await wait_for(failed, timeout=20, message="the delivery given up")
            (d,), _ = await endpoints.deliveries(ADMIN, ep.id, 0, "")
            assert d.state == "failed" and d.attempts >= 3 and d.next_attempt_at is None
            starts = [a["started_at"] for a in d.attempt_log]
            gaps = [(b - a) for a, b in zip(map(_instant, starts), map(_instant, starts[1:]))]
            assert all(g > 0 for g in gaps)  # spaced out, not a hot loop
            # manual redelivery: the receiver is fixed, the admin asks again
            rx.fail_first = 0
            again = await endpoints.redeliver(ADMIN, ep.id, d.id)
            assert again.state == "pending"
            await rx.until(lambda evs: len(evs) == 1)
            await settled(h.pool)
        finally:
            await stop(tasks)
    (ev,) = rx.events.values()
    assert ev["data"]["checkout"]["id"] == cid and ev["type"] == "checkout.completed"
    state = await h.pool.fetchval("SELECT state FROM webhook_deliveries WHERE endpoint_id = $1", uuid.UUID(ep.id))
    assert state == "delivered"


def _instant(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


async def test_two_workers_never_post_one_delivery_at_once_and_every_delivery_ends_delivered(harness, endpoints):
    h = harness
    async with Receiver(delay=0.05) as rx:
        eps = [await endpoints.create(ADMIN, rx.url, ["checkout.completed", "codes.delivered"]) for _ in range(2)]
        rx.secrets.extend(e.secret for e in eps)
        ids = [await buy_codes(h) for _ in range(10)]
        # Three attempts at a time each: neither worker can take every delivery alone.
        _, tasks = await run_workers(h.pool, 2, dataclasses.replace(FAST, batch_size=3, concurrency=3))
        try:
            await rx.until(lambda evs: len(evs) == 20, timeout=30)
            await settled(h.pool)
        finally:
            await stop(tasks)
    assert rx.overlaps == []
    # 20 events x 2 endpoints = 40 deliveries, each POSTed exactly once (no crash, no lease lost)
    per_delivery = {}
    for r in rx.requests:
        per_delivery[r["headers"]["cuty-delivery-id"]] = per_delivery.get(r["headers"]["cuty-delivery-id"], 0) + 1
    assert len(per_delivery) == 40 and set(per_delivery.values()) == {1}
    workers = await h.pool.fetch("SELECT DISTINCT worker FROM webhook_attempts a JOIN webhook_deliveries d "
                                 "ON d.merchant_id = a.merchant_id AND d.id = a.delivery_id WHERE d.endpoint_id = ANY($1)",
                                 [uuid.UUID(e.id) for e in eps])
    assert {w["worker"] for w in workers} == {"test-worker-0", "test-worker-1"}  # both took part
    assert {e["data"]["checkout"]["id"] for e in rx.events.values()} == set(ids)
    assert rx.duplicates == 20  # each event to both endpoints: the receiver deduplicates by event id


async def test_a_worker_that_dies_mid_post_leaves_the_delivery_to_be_sent_again(harness, endpoints):
    """The lease: a claimed delivery whose worker vanished is due again when the lease runs out."""
    h = harness
    async with Receiver() as rx:
        ep = await endpoints.create(ADMIN, rx.url, ["checkout.completed"])
        rx.secrets.append(ep.secret)
        await buy_codes(h)
        dead = DeliveryWorker(h.pool, "dead-worker", dataclasses.replace(FAST, lease_seconds=0.5))
        (claimed,) = await dead.deliveries.claim_due("dead-worker", 10, 0.5)  # ... and never finishes
        assert claimed.endpoint_id == ep.id
        _, tasks = await run_workers(h.pool, 1)
        try:
            await rx.until(lambda evs: len(evs) == 1)
            await settled(h.pool)
        finally:
            await stop(tasks)
        # the dead worker's late answer is fenced: the lease is not its own any more
        assert await dead.deliveries.finish(claimed, "dead-worker", delivered=False, retry_in=1, started_at=claimed.db_now,
                                            http_status=0, error="late", duration_ms=1) is None
    row = await h.pool.fetchrow("SELECT state, attempts FROM webhook_deliveries WHERE endpoint_id = $1", uuid.UUID(ep.id))
    assert row["state"] == "delivered" and row["attempts"] == 2


async def test_a_merchant_endpoint_answering_a_gzip_bomb_or_an_endless_body_costs_the_worker_nothing(
        harness, endpoints):
    """A merchant's admin chooses the URL, so the answer is the attacker's: a gzip body inflating to
    1 GiB, a body that never ends, one byte every 0.2 s. The worker reads a few KiB of any answer,
    raw, within its timeout: each delivery ends as its status says, memory stays flat, and the
    worker goes on delivering to everybody else."""
    h = harness
    options = dataclasses.replace(FAST, timeout_seconds=2.0)
    async with HostileEndpoint() as bad, Receiver() as rx:
        hostile = {(mode, status): await endpoints.create(ADMIN, bad.url(mode, status), ["checkout.completed"])
                   for mode, status in (("bomb", 200), ("bomb", 500), ("endless", 200), ("endless", 503),
                                        ("trickle", 200))}
        good = await endpoints.create(ADMIN, rx.url, ["checkout.completed"])
        rx.secrets.append(good.secret)

        async def first_delivery(ep):
            log, _ = await endpoints.deliveries(ADMIN, ep.id, 0, "")
            return log[-1]  # newest first

        async def attempts(ep):
            return (await first_delivery(ep)).attempt_log
        with RssPeak() as rss:
            _, tasks = await run_workers(h.pool, 1, options)
            try:
                await buy_codes(h)
                await rx.until(lambda evs: len(evs) == 1)

                async def every_hostile_answer_read_twice_or_delivered():
                    return all([len(await attempts(ep)) >= (1 if status == 200 else 2)
                                for (_, status), ep in hostile.items()])
                await wait_for(every_hostile_answer_read_twice_or_delivered, timeout=30,
                               message="every hostile endpoint answered")
                await buy_codes(h)  # the worker still serves the others
                await rx.until(lambda evs: len(evs) == 2)
                assert not any(t.done() for t in tasks)
            finally:
                await stop(tasks)
    print(f"RSS before {rss.before / 2**20:.0f} MiB, peak growth {rss.growth / 2**20:.1f} MiB; sent {bad.sent}")
    assert rss.growth < 50 * 2**20, f"RSS grew {rss.growth / 2**20:.1f} MiB"
    for (mode, status), ep in hostile.items():
        d = await first_delivery(ep)
        assert d.state == ("delivered" if status == 200 else "pending"), (mode, status)
        for a in d.attempt_log:
            assert a["http_status"] == status, (mode, a)
            assert a["duration_ms"] < 1000 * (options.timeout_seconds + 1), (mode, a)
        # what the worker let in: the socket buffers' worth of each answer (1 GiB inflated, endless)
        path = f"/{mode}/{status}"
        assert bad.sent[path] / sum(p == path for p, _ in bad.requests) < 16 * 2**20, (mode, bad.sent)
    assert (await attempts(hostile["trickle", 200]))[0]["error"] == "timeout"  # a class, not a message
    # every request asked for the answer uncompressed
    assert len(bad.requests) >= 7 and {h["accept-encoding"] for _, h in bad.requests} == {"identity"}


async def test_row_level_security_on_the_outbound_tables(harness, endpoints, checkout_dsn):
    """A forgotten `WHERE merchant_id = ...` still shows another merchant none of these rows."""
    from cutylib.testing.tenancy import probe_role, rows_seen, tenant_tables

    h = harness
    async with Receiver() as rx:
        ep = await endpoints.create(ADMIN, rx.url, ["checkout.completed"])
        rx.secrets.append(ep.secret)
        cid = await buy_codes(h)
        _, tasks = await run_workers(h.pool, 1)
        try:
            await rx.until(lambda evs: len(evs) == 1)
            await settled(h.pool)
        finally:
            await stop(tasks)
    outbound = ("merchant_events", "webhook_endpoints", "webhook_deliveries", "webhook_attempts")
    async with owner_connection(checkout_dsn) as conn:  # the superuser: probe_role makes a role
        tables = {t["table"]: t for t in await tenant_tables(conn)}
        assert set(outbound) <= set(tables)
        assert all(tables[t]["enabled"] and tables[t]["forced"] and tables[t]["has_policy"] for t in outbound)
        async with probe_role(conn) as role:
            for table, where, arg in (("merchant_events", "checkout_id = $1", uuid.UUID(cid)),
                                      ("webhook_endpoints", "id = $1", uuid.UUID(ep.id)),
                                      ("webhook_deliveries", "endpoint_id = $1", uuid.UUID(ep.id)),
                                      ("webhook_attempts", "true AND $1::text IS NOT NULL", "x")):
                assert await rows_seen(conn, role, table, TEST_MERCHANT, where, arg) >= 1, table
                assert await rows_seen(conn, role, table, OTHER_ADMIN.org, where, arg) == 0, table
