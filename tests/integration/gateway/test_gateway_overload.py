"""Flash-sale load at the edge, through the real gateway in front of a service that is slow (its
calls wait until the test lets them go): past the concurrency limit refusals come after a short
bounded wait for a freed place, as `503 overloaded` with Retry-After, without waiting for the busy
service; purchases already under way are still admitted; admitted requests complete.
Request-Timeout bounds a call's deadline."""
import asyncio
import uuid

import httpx
import pytest
from prometheus_client import REGISTRY

from cutylib import errors


class Gate:
    """A script whose calls wait until `open` is set; `waiting` counts the calls held."""

    def __init__(self):
        self.open = asyncio.Event()
        self.waiting = 0

    async def __call__(self, request, metadata):
        self.waiting += 1
        try:
            await self.open.wait()
        finally:
            self.waiting -= 1
        return None

    async def until_waiting(self, n: int) -> None:
        for _ in range(1000):
            if self.waiting >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{self.waiting} calls reached the service, expected {n}")


@pytest.fixture
def gate(script):
    g = Gate()
    yield g
    g.open.set()


def overloaded(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"] == "overloaded" and int(r.headers["retry-after"]) >= 1


def shed(route: str, criticality: str, reason: str) -> float:
    return REGISTRY.get_sample_value("cuty_gateway_requests_shed_total",
                                     {"http_route": route, "criticality": criticality, "reason": reason}) or 0.0


def create(c: httpx.AsyncClient, who: dict):
    return c.post("/v1/checkouts", json={"productId": "00000000-0000-4000-8000-000000000005", "quantity": 1},
                  headers={**who, "Idempotency-Key": uuid.uuid4().hex})


async def test_at_the_limit_a_pay_is_admitted_while_new_checkouts_and_reads_are_refused_at_once(
        start_gateway, fake, script, gate, bearer):
    # A limit of 4: new checkouts may use 3 places, reads 2, purchases under way all 4 and more.
    g = await start_gateway(concurrency_min=4, concurrency_max=4, concurrency_initial=4)
    script("CreateCheckout", gate)
    me = bearer("customer", sub="flash-buyer")
    before = shed("/v1/checkouts", "normal", "overloaded")
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        admitted = [asyncio.create_task(create(c, me)) for _ in range(3)]
        await gate.until_waiting(3)
        calls = len(fake.calls)

        overloaded(await create(c, me))
        overloaded(await c.get("/v1/salons/00000000-0000-4000-8000-000000000003/slots?startTime=2026-03-08T00:00:00Z&endTime=2026-03-09T00:00:00Z", headers=me))
        # Refused without reaching the service, and without waiting for the calls it holds.
        assert len(fake.calls) == calls and gate.waiting == 3
        assert shed("/v1/checkouts", "normal", "overloaded") == before + 1
        assert REGISTRY.get_sample_value("cuty_gateway_calls_in_flight") >= 3

        pay = await c.post("/v1/checkouts/00000000-0000-4000-8000-000000000001:pay", json={"paymentMethod": "pm_card_ok"},
                           headers={**me, "Idempotency-Key": uuid.uuid4().hex})
        assert pay.status_code == 200, pay.text
        assert (await c.get("/v1/checkouts/00000000-0000-4000-8000-000000000001", headers=me)).status_code == 200
        assert gate.waiting == 3

        gate.open.set()
        assert [r.status_code for r in await asyncio.gather(*admitted)] == [200, 200, 200]
        assert (await create(c, me)).status_code == 200  # the places are free again


async def test_a_flood_past_the_limit_is_refused_while_the_admitted_calls_still_run(
        start_gateway, fake, script, gate, bearer):
    g = await start_gateway(concurrency_min=5, concurrency_max=5, concurrency_initial=5)
    script("CreateCheckout", gate)
    creates = sum(1 for call in fake.calls if call.rpc == "CreateCheckout")
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        flood = [asyncio.create_task(create(c, bearer("customer", sub=f"buyer-{i}"))) for i in range(40)]
        for _ in range(1000):  # every refusal arrives while the service still holds the admitted calls
            if sum(t.done() for t in flood) == 37:
                break
            await asyncio.sleep(0.01)
        refused = [t.result() for t in flood if t.done()]
        assert len(refused) == 37
        for r in refused:
            overloaded(r)
        await gate.until_waiting(3)  # the admitted ones are held by the service, unanswered
        assert sum(t.done() for t in flood) == 37
        gate.open.set()
        answers = await asyncio.gather(*flood)
    assert sum(r.status_code == 200 for r in answers) == 3
    assert sum(1 for call in fake.calls if call.rpc == "CreateCheckout") == creates + 3


async def test_a_service_shedding_load_is_503_overloaded_and_lowers_the_limit(start_gateway, script, bearer):
    g = await start_gateway(concurrency_min=5, concurrency_max=50, concurrency_initial=40)

    def busy(request, metadata):
        raise errors.ResourceExhausted("concurrency cap reached")
    script("CreateCheckout", busy)
    before = shed("/v1/checkouts", "normal", "backend_overloaded")
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        overloaded(await create(c, bearer("customer")))
    assert g.app.admission.limit == 32
    assert shed("/v1/checkouts", "normal", "backend_overloaded") == before + 1


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf", "1e3", "7200"])
async def test_a_malformed_request_timeout_is_400_naming_the_header(client, fake, bearer, value):
    calls = len(fake.calls)
    r = await client.get("/v1/checkouts/00000000-0000-4000-8000-000000000001", headers={**bearer("customer"), "Request-Timeout": value})
    assert r.status_code == 400 and r.json()["field"] == "Request-Timeout", r.text
    assert len(fake.calls) == calls


async def test_request_timeout_is_the_calls_deadline(client, script, gate, bearer):
    script("GetCheckout", gate)  # never answers on its own
    r = await client.get("/v1/checkouts/00000000-0000-4000-8000-000000000001", headers={**bearer("customer"), "Request-Timeout": "0.3"})
    assert r.status_code == 504 and "0.3 s" in r.json()["detail"], r.text
    # More than the route allows is capped by it (this gateway's deadline: 2 s).
    r = await client.get("/v1/checkouts/00000000-0000-4000-8000-000000000001", headers={**bearer("customer"), "Request-Timeout": "3000"})
    assert r.status_code == 504 and "2 s" in r.json()["detail"], r.text


async def test_time_spent_in_the_gateway_counts_against_request_timeout(client, fake, bearer):
    calls = len(fake.calls)
    before = shed("/v1/checkouts/{checkout_id}", "critical", "deadline")
    r = await client.get("/v1/checkouts/00000000-0000-4000-8000-000000000001", headers={**bearer("customer"), "Request-Timeout": "0.000001"})
    assert r.status_code == 504 and "nothing was done" in r.json()["detail"], r.text
    assert len(fake.calls) == calls
    assert shed("/v1/checkouts/{checkout_id}", "critical", "deadline") == before + 1


async def test_a_refusal_for_load_verifies_no_token_and_reads_no_body(start_gateway, fake, script, gate, bearer):
    # Past capacity most requests are refused: each refusal must cost almost nothing, so admission
    # comes before the token's signature, the body and the transcoding.
    g = await start_gateway(concurrency_min=4, concurrency_max=4, concurrency_initial=4)
    script("CreateCheckout", gate)
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        admitted = [asyncio.create_task(create(c, bearer("customer", sub=f"early-{i}"))) for i in range(3)]
        await gate.until_waiting(3)
        verified, calls = g.app.verify.verified, len(fake.calls)

        # A token never seen before, a forged one, and a body that is not JSON: all refused for
        # load, none of them looked at.
        overloaded(await create(c, bearer("customer", sub="never-seen")))
        overloaded(await c.post("/v1/checkouts", content=b"{not json",
                                headers={"Authorization": "Bearer forged.token.here", "Idempotency-Key": "k1"}))
        assert g.app.verify.verified == verified
        assert len(fake.calls) == calls and g.app.admission.in_flight == 3

        gate.open.set()
        assert [r.status_code for r in await asyncio.gather(*admitted)] == [200, 200, 200]


async def test_an_admitted_request_refused_later_gives_its_place_back(start_gateway, fake, bearer):
    g = await start_gateway(concurrency_min=4, concurrency_max=4, concurrency_initial=4)
    limit = g.app.admission.limit
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        # 401 (forged token), 400 (a body that is not JSON), 400 (no Idempotency-Key), 403 (role)
        for _ in range(10):
            r = await c.post("/v1/checkouts", json={"productId": "p1", "quantity": 1},
                             headers={"Authorization": "Bearer forged.token.here", "Idempotency-Key": "k1"})
            assert r.status_code == 401, r.text
            r = await c.post("/v1/checkouts", content=b"{not json",
                             headers={**bearer("customer"), "Idempotency-Key": "k2"})
            assert r.status_code == 400, r.text
            r = await c.post("/v1/checkouts", json={"productId": "p1", "quantity": 1}, headers=bearer("customer"))
            assert r.status_code == 400 and r.json()["field"] == "Idempotency-Key", r.text
        assert g.app.admission.in_flight == 0
        # Not latency samples either: the limit did not move, and calls are admitted as before.
        assert g.app.admission.limit == limit
        assert (await create(c, bearer("customer"))).status_code == 200
    assert g.app.admission.in_flight == 0


async def test_refusals_for_load_keep_the_connection_open(start_gateway, script, gate, bearer):
    """A refused client (or the proxy in front of the gateway) sends its next request on the same
    connection: a refusal of a small body reads that body and keeps the connection, so thousands of
    refusals a second are not thousands of new connections."""
    g = await start_gateway(concurrency_min=4, concurrency_max=4, concurrency_initial=4)
    script("CreateCheckout", gate)
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        admitted = [asyncio.create_task(create(c, bearer("customer", sub=f"early-{i}"))) for i in range(3)]
        await gate.until_waiting(3)
        host, port = g.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            auth = bearer("customer", sub="refused")["Authorization"]
            body = b'{"productId":"00000000-0000-4000-8000-000000000005","quantity":1}'
            for i in range(5):
                writer.write((f"POST /v1/checkouts HTTP/1.1\r\nHost: gw\r\nAuthorization: {auth}\r\n"
                              f"Idempotency-Key: k{i}\r\nContent-Type: application/json\r\n"
                              f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
                head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).lower()
                assert head.startswith(b"http/1.1 503 ") and b"connection: close" not in head, head
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                assert b'"overloaded"' in await reader.readexactly(length)
            assert not reader.at_eof()
        finally:
            writer.close()
        gate.open.set()
        assert [r.status_code for r in await asyncio.gather(*admitted)] == [200, 200, 200]


async def test_a_request_past_the_limit_waits_briefly_for_a_freed_place_instead_of_a_refusal(
        start_gateway, fake, script, gate, bearer):
    """A burst that finds the places taken is served when places free within its short wait
    (CUTY_GATEWAY_QUEUE_SECONDS); one that finds no place free in time is refused as before."""
    g = await start_gateway(concurrency_min=4, concurrency_max=4, concurrency_initial=4, queue_seconds=10.0)
    script("CreateCheckout", gate)
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        admitted = [asyncio.create_task(create(c, bearer("customer", sub=f"early-{i}"))) for i in range(3)]
        await gate.until_waiting(3)
        late = [asyncio.create_task(create(c, bearer("customer", sub=f"late-{i}"))) for i in range(2)]
        for _ in range(1000):
            if g.app.admission.queued == 2:
                break
            await asyncio.sleep(0.01)
        assert g.app.admission.queued == 2 and gate.waiting == 3 and not any(t.done() for t in late)
        gate.open.set()  # the first calls end: their places pass to the waiting requests
        answers = await asyncio.gather(*admitted, *late)
    assert [r.status_code for r in answers] == [200] * 5
    assert g.app.admission.in_flight == 0 and g.app.admission.queued == 0
