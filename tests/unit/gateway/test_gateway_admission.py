"""Admission control (admission.py) on a fake clock, the criticality table, Request-Timeout parsing
and the client address the rate limit is keyed by."""
import asyncio
import math
import time

import pytest

from gateway import admission
from gateway.admission import BACKOFF, OK, OVERLOAD, TIMEOUT, WINDOW_SECONDS, AdmissionControl
from gateway.app import Gateway, _request_timeout
from gateway.policy import CRITICAL, LOAD, NORMAL, POLICY, SHEDDABLE, load_for
from gateway.problems import Problem
from cutylib.tls import Transport
from gateway.settings import GatewaySettings


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def control(clock, *, min_limit=10, max_limit=100, initial=20, target=0.05, tolerance=2.0):
    return AdmissionControl(min_limit=min_limit, max_limit=max_limit, initial_limit=initial,
                            tolerance=tolerance, target_seconds=target, clock=clock)


def window(c: AdmissionControl, clock: Clock, *, seconds: float, calls: int, outcome=OK, route="r"):
    """One window: `calls` calls in flight at once, each of them having taken `seconds` when it
    ends; then the window closes (with a call of another route that took no time)."""
    for _ in range(calls):
        assert c.admit(CRITICAL)
    for _ in range(calls):
        c.release(route, clock.now - seconds, outcome)
    clock.now += WINDOW_SECONDS * 1.01
    assert c.admit(CRITICAL)
    c.release("tick", clock.now, OK)


def drive(c: AdmissionControl, clock: Clock, seconds: float, done_per_second, rtt=lambda limit: 0.01,
          route="r") -> list[int]:
    """`seconds` of a backend that completes done_per_second(limit) calls a second, each having
    taken rtt(limit), with demand always meeting the limit (new work fills its share, and each
    call that ends is replaced at once). The limit after every call."""
    seen = []
    end = clock.now + seconds
    while c.admit(NORMAL):
        pass
    while clock.now < end:
        n = max(1, round(done_per_second(c.limit) * WINDOW_SECONDS))
        for _ in range(n):
            clock.now += WINDOW_SECONDS / n
            c.release(route, clock.now - rtt(c.limit))
            while c.admit(NORMAL):
                pass
            seen.append(c.limit)
    return seen


def test_the_limit_grows_while_throughput_grows_with_it():
    """Below the backends' capacity every place added is more done: the limit keeps growing."""
    clock = Clock()
    c = control(clock, min_limit=20, max_limit=1000, initial=20)
    seen = drive(c, clock, 30, lambda limit: 10 * limit)
    assert seen[-1] > 200 and max(seen) <= 1000


def test_the_limit_comes_down_when_latency_rises_at_flat_throughput():
    """Past capacity (1,000 calls a second whatever the limit), more in flight is only more
    latency (Little's law): the limit falls to its minimum."""
    clock = Clock()
    c = control(clock, min_limit=20, max_limit=500, initial=200)
    seen = drive(c, clock, 30, lambda limit: 1000, rtt=lambda limit: limit * 0.75 / 1000)
    assert seen[-1] <= 25 and min(seen) >= 20


def test_the_limit_settles_at_the_knee_of_throughput():
    """Throughput rises with the limit up to 80 places, then stays flat: the limit ends near 80,
    not at its minimum nor its maximum."""
    clock = Clock()
    c = control(clock, min_limit=10, max_limit=1000, initial=20)
    seen = drive(c, clock, 60, lambda limit: 10 * min(limit, 80),
                 rtt=lambda limit: max(0.01, 0.0075 * limit / min(limit, 80)))
    tail = seen[len(seen) // 2:]
    assert 50 <= sorted(tail)[len(tail) // 2] <= 130 and max(seen) < 200


def test_the_limit_stays_within_min_and_max():
    clock = Clock()
    c = control(clock, min_limit=20, max_limit=60, initial=20)
    assert max(drive(c, clock, 20, lambda limit: 10 * limit)) == 60
    c = control(clock, min_limit=20, max_limit=60, initial=60)
    seen = drive(c, clock, 20, lambda limit: 300, rtt=lambda limit: limit / 300)
    assert min(seen) == 20 and max(seen) == 60


def test_a_limit_nobody_presses_does_not_move():
    clock = Clock()
    c = control(clock, initial=50)
    for _ in range(100):  # 3 calls at a time against 50 places, whatever their latency
        window(c, clock, seconds=0.01 if _ % 2 else 0.5, calls=3)
    assert c.limit == 50


def test_error_answers_are_no_sample_of_a_routes_no_load_latency():
    clock = Clock()
    c = control(clock)
    window(c, clock, seconds=0.04, calls=5)
    window(c, clock, seconds=0.001, calls=5, outcome=admission.ERROR)  # a quick refusal by the service
    assert c.no_load_latency("r") == pytest.approx(0.04)


def test_a_backend_overload_answer_cuts_at_once_but_once_per_window():
    clock = Clock()
    c = control(clock, initial=50)
    for _ in range(3):
        assert c.admit(NORMAL)
    c.release("r", clock.now, OVERLOAD)
    assert c.limit == 40
    c.release("r", clock.now, OVERLOAD)  # the same burst: no second cut
    assert c.limit == 40
    clock.now += WINDOW_SECONDS * 1.01
    c.release("r", clock.now, OVERLOAD)
    assert c.limit == 32


def test_a_deadline_is_overload_only_when_the_call_ran_past_its_target():
    clock = Clock()
    c = control(clock, initial=50)
    window(c, clock, seconds=0.01, calls=3)
    limit = c.limit
    assert c.admit(NORMAL)
    clock.now += 0.02  # the client's own 20 ms Request-Timeout ran out: no sign of overload
    c.release("r", clock.now - 0.02, TIMEOUT)
    assert c.limit == limit
    assert c.admit(NORMAL)
    clock.now += 2.0
    c.release("r", clock.now - 2.0, TIMEOUT)
    assert c.limit == int(limit * BACKOFF)


def test_at_the_limit_critical_work_is_admitted_and_new_work_refused():
    c = control(Clock(), min_limit=8, max_limit=8, initial=8)
    assert c.cap(SHEDDABLE) == 4 and c.cap(NORMAL) == 6 and c.cap(CRITICAL) == 9
    admitted = [c.admit(NORMAL) for _ in range(7)]
    assert admitted == [True] * 6 + [False]
    assert not c.admit(SHEDDABLE)
    assert [c.admit(CRITICAL) for _ in range(4)] == [True, True, True, False]  # the limit plus headroom
    c.release("r", 0.0)
    assert c.admit(CRITICAL) and not c.admit(NORMAL)


def test_disabled_admits_everything():
    c = control(Clock(), max_limit=0)
    assert all(c.admit(SHEDDABLE) for _ in range(10_000))
    assert c.in_flight == 10_000


def test_retry_after_is_whole_seconds_spread_over_a_range():
    values = {int(admission.retry_after()) for _ in range(200)}
    assert values <= set(range(admission.RETRY_AFTER[0], admission.RETRY_AFTER[1] + 1)) and len(values) > 1


def test_every_route_has_a_criticality_and_a_deadline(routes):
    rpcs = {r.rpc for r in routes.values()}
    assert set(LOAD) == rpcs == set(POLICY), "a route was added or removed: classify it in policy.LOAD"
    assert all(load_for(r).criticality in (CRITICAL, NORMAL, SHEDDABLE) and load_for(r).max_seconds > 0 for r in rpcs)
    by_route = {(r.http_method, r.template.source): load_for(r.rpc).criticality for r in routes.values()}
    # Finishing a purchase already started is critical; new purchases and reads are not.
    assert {k for k, v in by_route.items() if v == CRITICAL} == {
        ("POST", "/v1/checkouts/{checkout_id}:pay"), ("POST", "/v1/psp/webhooks"),
        ("GET", "/v1/checkouts/{checkout_id}"), ("GET", "/v1/checkouts/{checkout_id}:watch"),
        ("POST", "/v1/checkouts/{checkout_id}:cancel")}
    assert by_route[("POST", "/v1/checkouts")] == NORMAL
    assert all(v == SHEDDABLE for (method, path), v in by_route.items()
               if method == "GET" and path not in ("/v1/checkouts/{checkout_id}", "/v1/checkouts/{checkout_id}:watch"))


def test_route_deadlines_are_capped_by_the_setting(routes):
    g = gateway(list(routes.values()), deadline_seconds=12, sse_max_seconds=600)
    assert g.load[routes["PayCheckout"].rpc] == (CRITICAL, 12)
    assert g.load[routes["CreateCheckout"].rpc] == (NORMAL, 10)
    assert g.load[routes["ListSlots"].rpc] == (SHEDDABLE, 5)
    assert g.load[routes["WatchCheckout"].rpc] == (CRITICAL, 600)


@pytest.mark.parametrize("raw, seconds", [("2.5", 2.5), ("10", 10.0), (" 0.25 ", 0.25), (".5", 0.5), ("3600", 3600.0)])
def test_request_timeout_accepts_decimal_seconds(raw, seconds):
    assert _request_timeout(raw) == seconds


@pytest.mark.parametrize("raw", ["", "abc", "-1", "0", "0.0", "nan", "NaN", "inf", "Infinity", "1e3", "1_0",
                                 "3600.5", "86400", "9" * 400, "2.5s", "+3", "0x10", "١٢"])
def test_request_timeout_refuses_anything_else_naming_the_header(raw):
    with pytest.raises(Problem) as e:
        _request_timeout(raw)
    assert e.value.status == 400 and e.value.extra == {"field": "Request-Timeout"}
    assert "Request-Timeout" in e.value.detail and len(e.value.detail) < 200


def gateway(routes=(), **settings) -> Gateway:
    """A gateway that is never started (no channel is opened, nothing is signed)."""
    return Gateway(GatewaySettings(jwt_secret="x" * 32, backends={o: "127.0.0.1:1" for o in ("booking", "codepool", "payments")},
                                   transport=Transport.plaintext("gateway"), signer=object(), **settings), list(routes))


def test_client_address_is_the_socket_peer_without_a_trusted_header():
    g = gateway()
    scope = {"client": ("203.0.113.7", 5555)}
    assert g.client_address(scope, {"x-forwarded-for": "1.1.1.1"}) == "203.0.113.7"  # not trusted: ignored


@pytest.mark.parametrize("hop, expected", [("last", "198.51.100.9"), ("first", "1.1.1.1")])
def test_client_address_from_the_trusted_proxy_header(hop, expected):
    g = gateway(client_ip_header="X-Forwarded-For", client_ip_hop=hop)
    scope = {"client": ("10.0.0.2", 5555)}
    assert g.client_address(scope, {"x-forwarded-for": "1.1.1.1, 198.51.100.9"}) == expected
    assert g.client_address(scope, {}) == "10.0.0.2"  # no header: the peer


def test_an_ipv6_client_is_its_64_and_a_mapped_one_its_ipv4():
    g = gateway()
    one = g.client_address({"client": ("2001:db8:1:2:aaaa::1", 1)}, {})
    assert one == g.client_address({"client": ("2001:db8:1:2:ffff:ffff:ffff:ffff", 1)}, {})
    assert one != g.client_address({"client": ("2001:db8:1:3::1", 1)}, {})
    assert g.client_address({"client": ("::ffff:192.0.2.1", 1)}, {}) == "192.0.2.1"


def test_a_bad_hop_setting_is_refused():
    with pytest.raises(ValueError, match="CUTY_GATEWAY_CLIENT_IP_HOP"):
        gateway(client_ip_hop="middle")


def test_bounds_are_sane():
    c = control(Clock(), min_limit=0, max_limit=5, initial=50)
    assert (c.min_limit, c.max_limit, c.limit) == (1, 5, 5)
    assert math.isinf(control(Clock(), max_limit=0).cap(CRITICAL))


# The short wait for a freed place (acquire) ------------------------------------------------------
def queued(clock=None, *, limit=4, wait=0.2, target=0.01, critical=1.0, queue_max=10) -> AdmissionControl:
    return AdmissionControl(min_limit=limit, max_limit=limit, initial_limit=limit, tolerance=2.0, target_seconds=0.05,
                            queue_seconds=wait, queue_target_seconds=target, critical_queue_seconds=critical,
                            queue_max=queue_max, clock=clock or Clock())


def fill(c: AdmissionControl, criticality=NORMAL) -> None:
    while c.admit(criticality):
        pass


async def test_a_request_finding_its_share_in_use_gets_a_place_freed_within_its_wait():
    c = queued(limit=4)  # new work: 3 places
    fill(c)
    waiter = asyncio.create_task(c.acquire(NORMAL, 30.0))
    await asyncio.sleep(0.01)
    assert not waiter.done() and c.queued == 1
    c.release("r", c.clock())  # the freed place passes to the waiter, not to a newcomer
    assert c.in_flight == 3 and not c.admit(NORMAL)
    assert await waiter is True
    assert c.queued == 0


async def test_a_request_is_refused_when_no_place_frees_within_its_wait_or_its_budget():
    c = queued(wait=0.05)
    fill(c)
    t0 = time.perf_counter()
    assert await c.acquire(NORMAL, 30.0) is False
    assert 0.04 <= time.perf_counter() - t0 < 1.0
    t0 = time.perf_counter()
    assert await c.acquire(NORMAL, 0.0) is False  # no time left in the request's budget: no wait
    assert time.perf_counter() - t0 < 0.04
    assert c.queued == 0 and c.in_flight == 3


async def test_a_freed_place_goes_to_a_purchase_under_way_before_older_new_work():
    c = queued(limit=4)
    fill(c, CRITICAL)  # every place, the headroom included
    new = asyncio.create_task(c.acquire(NORMAL, 30.0))
    await asyncio.sleep(0.01)
    pay = asyncio.create_task(c.acquire(CRITICAL, 30.0))
    await asyncio.sleep(0.01)
    c.release("r", c.clock())
    assert await pay is True
    assert not new.done()
    for _ in range(3):  # new work gets a place only once its share (3 of 5 in flight) allows it
        c.release("r", c.clock())
    assert await new is True and c.in_flight == 3


async def test_a_purchase_under_way_waits_longer_than_new_work_before_a_refusal():
    c = queued(wait=0.02, critical=5.0)
    fill(c, CRITICAL)
    pay = asyncio.create_task(c.acquire(CRITICAL, 30.0))
    assert await c.acquire(NORMAL, 30.0) is False  # refused after its 20 ms
    assert not pay.done()
    c.release("r", c.clock())
    assert await pay is True


async def test_at_most_queue_max_wait_and_the_rest_are_refused_at_once():
    """New work may fill half the queue; the other half stays for purchases under way."""
    c = queued(queue_max=4)
    fill(c, CRITICAL)
    waiting = [asyncio.create_task(c.acquire(NORMAL, 30.0)) for _ in range(2)]
    await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    assert await c.acquire(NORMAL, 30.0) is False
    assert time.perf_counter() - t0 < 0.05
    pays = [asyncio.create_task(c.acquire(CRITICAL, 30.0)) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert c.queued == 4
    assert await c.acquire(CRITICAL, 30.0) is False  # the queue is full
    for _ in range(6):
        c.release("r", c.clock())
    assert await asyncio.gather(*pays) == [True, True]
    assert await asyncio.gather(*waiting) == [True, True]


async def test_a_standing_queue_shortens_the_wait_of_new_work_but_not_of_purchases():
    clock = Clock()
    c = queued(clock, wait=0.2, target=0.01)
    fill(c, CRITICAL)
    assert c.max_wait(NORMAL) == 0.2
    pay = asyncio.create_task(c.acquire(CRITICAL, 30.0))
    await asyncio.sleep(0.01)
    clock.now += admission.QUEUE_INTERVAL  # the queue has not been empty for an interval
    assert c.max_wait(NORMAL) == 0.01 and c.max_wait(CRITICAL) == 1.0
    c.release("r", c.clock())
    assert await pay is True and c.queued == 0
    assert c.max_wait(NORMAL) == 0.2  # empty again: a burst may wait


async def test_a_client_leaving_while_it_waits_loses_no_place():
    c = queued(limit=4)
    fill(c)
    gone = asyncio.create_task(c.acquire(NORMAL, 30.0))
    stays = asyncio.create_task(c.acquire(NORMAL, 30.0))
    await asyncio.sleep(0.01)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert c.queued == 1
    c.release("r", c.clock())
    assert await stays is True and c.in_flight == 3
    # handed a place, then cancelled before it ran: the place is given back
    late = asyncio.create_task(c.acquire(NORMAL, 30.0))
    await asyncio.sleep(0.01)
    c.release("r", c.clock())
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    assert c.in_flight == 2 and c.queued == 0


async def test_a_request_is_refused_at_once_when_no_place_is_likely_to_free_within_its_wait():
    """Places freed at 100 a second and a 20 ms wait: about two places free within it, so a third
    waiter's wait would end in a refusal anyway; it is refused now."""
    c = queued(limit=4, wait=0.02, queue_max=100)
    fill(c, CRITICAL)
    c.free_rate = 100.0
    first = [asyncio.create_task(c.acquire(NORMAL, 30.0)) for _ in range(2)]
    await asyncio.sleep(0)
    assert c.queued == 2
    t0 = time.perf_counter()
    assert await c.acquire(NORMAL, 30.0) is False
    assert time.perf_counter() - t0 < 0.01 and c.queued == 2
    # a purchase under way waits behind purchases only, up to its own (longer) wait
    pay = asyncio.create_task(c.acquire(CRITICAL, 30.0))
    await asyncio.sleep(0)
    assert c.queued == 3
    c.release("r", c.clock())
    assert await pay is True
    assert await asyncio.gather(*first) == [False, False]  # no place freed for them within 20 ms


async def test_a_flood_of_waiters_never_exceeds_the_queue_bound():
    c = queued(limit=4, wait=0.05, queue_max=10)
    fill(c, CRITICAL)
    tasks = [asyncio.create_task(c.acquire(CRITICAL if i % 2 else NORMAL, 30.0)) for i in range(200)]
    await asyncio.sleep(0)
    assert c.queued <= 10
    results = await asyncio.gather(*tasks)
    assert c.queued == 0 and not any(results)


def test_any_sequence_of_calls_keeps_the_limit_within_its_bounds_and_never_raises():
    """Seeded: calls of mixed routes, outcomes and latencies, bursts and long silences (a window or
    a measurement closing while a change settles); every call's place is given back."""
    import random

    rng = random.Random(5)
    clock = Clock()
    c = control(clock, min_limit=10, max_limit=80, initial=10)
    flying: list[float] = []
    for _ in range(20_000):
        clock.now += rng.choice((0.0005, 0.002, 0.01, 0.3, 1.5)) if rng.random() < 0.2 else 0.001
        if flying and rng.random() < 0.5:
            started = flying.pop(rng.randrange(len(flying)))
            c.release(rng.choice(("a", "b")), started, rng.choice((OK, OK, OK, admission.ERROR, OVERLOAD, TIMEOUT)))
        elif c.admit(rng.choice((CRITICAL, NORMAL, SHEDDABLE))):
            flying.append(clock.now)
        assert 10 <= c.limit <= 80
    for started in flying:
        c.release("a", started)
    assert c.in_flight == 0


def test_a_long_silence_after_a_cut_of_slow_calls_closes_the_measurement_cleanly():
    clock = Clock()
    c = control(clock, initial=50)
    for _ in range(200):  # calls of 3 s each, one every 10 ms
        assert c.admit(CRITICAL)
        clock.now += 0.01
        c.release("slow", clock.now - 3.0)
    assert c.admit(CRITICAL)
    c.release("slow", clock.now - 3.0, OVERLOAD)  # a cut: the limit's change settles
    for gap in (0.2, 2.5, 2.5):  # then nothing ends for seconds
        clock.now += gap
        assert c.admit(CRITICAL)
        c.release("slow", clock.now - 3.0)
    assert c.in_flight == 0 and 10 <= c.limit < 50


def test_the_limit_falls_with_the_platforms_capacity_at_once():
    """The limit has grown to a platform that did 10 calls a second per place up to 100 places;
    then the platform's capacity falls to 300 calls a second (other work took its cores): within a
    few seconds the limit is near the 30 places that now deliver it, not 100."""
    clock = Clock()
    c = control(clock, min_limit=10, max_limit=1000, initial=10)
    drive(c, clock, 60, lambda limit: 10 * min(limit, 100), rtt=lambda limit: max(0.01, 0.1 * limit / min(limit, 100)))
    assert c.limit >= 60
    seen = drive(c, clock, 5, lambda limit: 10 * min(limit, 30), rtt=lambda limit: max(0.01, 0.1 * limit / min(limit, 30)))
    assert seen[-1] <= 45
