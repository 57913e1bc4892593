"""WatchCheckout in process (real PostgreSQL, the real saga, fake booking / PSP).

Events come from LISTEN/NOTIFY (one listener per process), are resumable by event id, carry the
buyer's action to the buyer only, warn before a hold runs out, are capped per user, and keep
arriving after the listener's connection is killed."""
from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest_asyncio

from cuty.payments.v1 import checkout_pb2 as pb, checkout_pb2_grpc
from cutylib import errors
from cutylib.principal import Principal
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import TEST_MERCHANT, user
from payments.checkout.domain import validate_create

C = "watcher-" + uuid.uuid4().hex[:8]
OTHER = "merchant-other-" + uuid.uuid4().hex[:6]
STATE = pb.CheckoutState.Name


@pytest_asyncio.fixture
async def live(make_harness):
    made = []

    async def make(**options):
        h = make_harness(**options)
        h.start_workers(1)
        task = asyncio.create_task(h.service.watchers.run())
        made.append(task)
        await asyncio.wait_for(h.service.watchers.connected.wait(), 5)
        ch = await h.serve()
        return h, checkout_pb2_grpc.CheckoutServiceStub(ch)

    yield make
    for t in made:
        t.cancel()
    await asyncio.gather(*made, return_exceptions=True)


def watch(stub, checkout_id, md, after=0):
    return stub.WatchCheckout(pb.WatchCheckoutRequest(checkout_id=checkout_id, after_event_id=after), metadata=md)


async def read_all(call, timeout=10.0) -> list[pb.CheckoutEvent]:
    out = []
    while True:
        e = await asyncio.wait_for(call.read(), timeout)
        if e is grpc.aio.EOF:
            return out
        out.append(e)


async def saga_events(h, checkout_id) -> list[tuple[int, str]]:
    rows = await h.pool.fetch("SELECT seq, to_status FROM payment_events WHERE checkout_id = $1 AND source = 'saga' "
                              "ORDER BY seq", uuid.UUID(checkout_id))
    return [(r["seq"], r["to_status"]) for r in rows]


async def create(h, customer=C):
    return await h.service.create(customer, validate_create(h.booking.add_slot(price=9900), "", 0), "")


async def test_every_transition_of_a_3ds_purchase_arrives_and_the_action_only_to_the_buyer(live):
    h, stub = await live()
    created = await create(h)
    mine = watch(stub, created.id, user(C, "customer"))
    staff = watch(stub, created.id, user("staff-1", "staff"))
    first = await asyncio.wait_for(mine.read(), 5)
    assert (first.type, STATE(first.checkout.state)) == ("state-changed", "CHECKOUT_STATE_HELD")
    assert (await asyncio.wait_for(staff.read(), 5)).id == first.id
    paid = await h.service.pay(C, created.id, "pm_card_3ds", "")
    pi = (await h.core.get(paid.payment.id)).psp_intent_id
    await wait_for(lambda: _state_is(h, created.id, "AWAITING_ACTION"), timeout=5)
    # Read up to the action, then the customer finishes 3-D Secure.
    seen = [first]
    while seen[-1].type != "payment-action-required":
        seen.append(await asyncio.wait_for(mine.read(), 5))
    action = seen[-1]
    assert action.checkout.payment.next_action.redirect_url.startswith("https://psp.example/3ds/")
    await h.core.finalize(paid.payment.id, "succeeded", "webhook", intent=h.psp.set_status(pi))
    seen += await read_all(mine)
    by_staff = [first] + await read_all(staff)
    logged = await saga_events(h, created.id)
    # Exactly the log from HELD on, in order, ending with COMPLETED (the stream then ends).
    assert [(e.id, STATE(e.checkout.state).removeprefix("CHECKOUT_STATE_")) for e in seen] == logged[-len(seen):]
    assert logged[-len(seen)][1] == "HELD" and logged[-1][1] == "COMPLETED"
    assert [e.id for e in by_staff] == [e.id for e in seen]
    staff_action = next(e for e in by_staff if e.type == "payment-action-required")
    assert not staff_action.checkout.payment.HasField("next_action") and not staff_action.checkout.payment.client_secret
    assert staff_action.checkout.HasField("diagnostics")
    assert not seen[-1].checkout.payment.client_secret  # terminal: no secret, whoever asks


async def test_resume_after_an_event_id_replays_exactly_what_was_missed(live):
    h, stub = await live()
    created = await create(h)
    await h.service.pay(C, created.id, "pm_card_ok", "")
    await wait_for(lambda: _state_is(h, created.id, "COMPLETED"), timeout=5)
    logged = await saga_events(h, created.id)
    assert len(logged) >= 3
    # A completed checkout without Last-Event-ID: its state now, and the stream ends.
    now = await read_all(watch(stub, created.id, user(C, "customer")))
    assert [(e.id, e.type) for e in now] == [(logged[-1][0], "state-changed")]
    # Resumed after the first event: every later one, none twice, none missing.
    after = await read_all(watch(stub, created.id, user(C, "customer"), after=logged[0][0]))
    assert [(e.id, STATE(e.checkout.state).removeprefix("CHECKOUT_STATE_")) for e in after] == logged[1:]
    # The same through the Last-Event-ID metadata the gateway forwards.
    md = user(C, "customer") + (("last-event-id", str(logged[1][0])),)
    assert [e.id for e in await read_all(watch(stub, created.id, md))] == [s for s, _ in logged[2:]]


async def test_hold_expiring_is_sent_once_at_ttl_minus_the_warning(live):
    h, stub = await live(hold_ttl=4, hold_warning_seconds=2)
    created = await create(h)
    call = watch(stub, created.id, user(C, "customer"))
    first = await asyncio.wait_for(call.read(), 5)
    assert STATE(first.checkout.state) == "CHECKOUT_STATE_HELD"
    t0 = asyncio.get_running_loop().time()
    warning = await asyncio.wait_for(call.read(), 5)
    waited = asyncio.get_running_loop().time() - t0
    assert warning.type == "hold-expiring" and warning.id == first.id, warning
    assert 1.0 <= waited <= 3.5, waited  # about TTL (4 s) - 2 s after the hold was taken
    # Then the hold runs out: the saga releases it and the stream ends after EXPIRED, no second warning.
    rest = await read_all(call)
    assert [e.type for e in rest] == ["state-changed"] * len(rest)
    assert STATE(rest[-1].checkout.state) == "CHECKOUT_STATE_EXPIRED"


async def test_open_streams_per_user_are_capped(live):
    h, stub = await live(max_watch_streams_per_user=2)
    me = "capped-" + uuid.uuid4().hex[:8]
    created = await create(h, me)
    md = user(me, "customer")
    open_ = [watch(stub, created.id, md) for _ in range(2)]
    for call in open_:
        await asyncio.wait_for(call.read(), 5)
    third = watch(stub, created.id, md)
    try:
        await asyncio.wait_for(third.read(), 5)
        raise AssertionError("a third stream was admitted")
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The cap holds across replicas: a second payments process (its own Watchers) refuses too.
    from payments.checkout.live import Watchers
    other = Watchers(h.pool, h.options)
    try:
        async with other.admitted(me):
            raise AssertionError("another process admitted a third stream")
    except errors.ResourceExhausted as e:
        assert e.reason == "too-many-watch-streams"
    # Another user is not counted against this one; a closed stream frees its place.
    assert (await asyncio.wait_for(watch(stub, created.id, user("staff-1", "staff")).read(), 5)).id
    open_[0].cancel()
    await wait_for(lambda: _places_below(h, me, 2), timeout=5)
    again = watch(stub, created.id, md)
    assert (await asyncio.wait_for(again.read(), 5)).id
    again.cancel()
    open_[1].cancel()


async def test_another_merchant_and_another_customer_find_nothing_and_the_operator_is_audited_once(live):
    h, stub = await live()
    created = await create(h)
    for md in (user("x-1", "staff", OTHER), user("x-2", "admin", OTHER), user("someone-else", "customer")):
        try:
            await asyncio.wait_for(watch(stub, created.id, md).read(), 5)
            raise AssertionError(f"{md} saw the checkout")
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND
    assert await h.service.seen(Principal("staff-1", "staff", TEST_MERCHANT), created.id)
    op = "op-" + uuid.uuid4().hex[:6]
    call = watch(stub, created.id, user(op, "operator"))
    await asyncio.wait_for(call.read(), 5)
    await h.service.cancel(C, created.id)
    events = await read_all(call)
    assert STATE(events[-1].checkout.state) == "CHECKOUT_STATE_CANCELLED"
    audited = await h.pool.fetch("SELECT rpc FROM operator_reads WHERE subject = $1 AND object_id = $2", op,
                                 created.id)
    assert [r["rpc"] for r in audited] == ["WatchCheckout"]


async def test_the_listener_reconnects_after_its_connection_is_killed(live):
    h, stub = await live(watch_check_seconds=0.5)
    created = await create(h)
    call = watch(stub, created.id, user(C, "customer"))
    first = await asyncio.wait_for(call.read(), 5)
    pid = await h.service.watchers.listener_pid()
    assert pid
    before = h.service.watchers.reconnects
    assert await h.pool.fetchval("SELECT pg_terminate_backend($1)", pid)
    await wait_for(lambda: _reconnected(h, before), timeout=10, message="listener reconnected")
    assert await h.service.watchers.listener_pid() != pid
    await h.service.pay(C, created.id, "pm_card_ok", "")
    events = await read_all(call)
    logged = await saga_events(h, created.id)
    assert [first.id] + [e.id for e in events] == [s for s, st in logged if s >= first.id]
    assert STATE(events[-1].checkout.state) == "CHECKOUT_STATE_COMPLETED"


async def _state_is(h, checkout_id, state):
    return (await h.row(checkout_id))["state"] == state


async def _places_below(h, subject, n):
    return await h.pool.fetchval("SELECT count(*) FROM watch_streams WHERE subject = $1", subject) < n


async def _reconnected(h, before):
    return h.service.watchers.reconnects > before and h.service.watchers.connected.is_set()


async def test_a_place_left_by_a_dead_process_is_free_once_its_lease_runs_out(live):
    h, _stub = await live(max_watch_streams_per_user=1)
    me = "orphaned-" + uuid.uuid4().hex[:8]
    await h.pool.execute("INSERT INTO watch_streams (subject, slot, process, stream, lease_until) "
                         "VALUES ($1, 0, 'watch:dead', 's', clock_timestamp() + interval '1 hour')", me)
    try:
        async with h.service.watchers.admitted(me):
            raise AssertionError("admitted over a live place")
    except errors.ResourceExhausted:
        pass
    await h.pool.execute("UPDATE watch_streams SET lease_until = clock_timestamp() WHERE subject = $1", me)
    async with h.service.watchers.admitted(me):
        row = await h.pool.fetchrow("SELECT process FROM watch_streams WHERE subject = $1", me)
        assert row["process"] == h.service.watchers.process
    assert await h.pool.fetchval("SELECT count(*) FROM watch_streams WHERE subject = $1", me) == 0
