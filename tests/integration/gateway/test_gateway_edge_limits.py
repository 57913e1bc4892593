"""Auth, limits and tracing at the edge: refused requests never reach a service."""
import asyncio
import json
import secrets

import httpx
import pytest
from prometheus_client import REGISTRY

SLOTS = "/v1/salons/00000000-0000-4000-8000-000000000003/slots?startTime=2026-03-08T00:00:00Z&endTime=2026-03-09T00:00:00Z"
SLOTS_ROUTE = "/v1/salons/{salon_id}/slots"


@pytest.fixture
def untouched(fake):
    before = len(fake.calls)
    yield
    assert len(fake.calls) == before, "a refused request reached the service"


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Basic YWRtaW46YWRtaW4="}, {"Authorization": "Bearer garbage"},
])
async def test_no_or_malformed_token_is_401(client, untouched, headers):
    r = await client.get(SLOTS, headers=headers)
    assert r.status_code == 401 and r.json()["type"] == "unauthenticated"
    assert r.headers["www-authenticate"].startswith("Bearer")


async def test_bad_signature_and_expired_token_are_401(client, untouched, bearer):
    r = await client.get(SLOTS, headers=bearer("customer", secret="not-the-gateway-secret-0123456789abcdef"))
    assert r.status_code == 401 and "signature" in r.json()["detail"]
    r = await client.get(SLOTS, headers=bearer("customer", ttl=-60))  # beyond the 30 s leeway
    assert r.status_code == 401 and "expired" in r.json()["detail"]


@pytest.mark.parametrize("method, path, role", [
    ("POST", "/v1/salons", "customer"), ("POST", "/v1/salons", "staff"),
    ("GET", "/v1/products/00000000-0000-4000-8000-000000000005/stock", "customer"), ("POST", "/v1/codes/00000000-0000-4000-8000-000000000006:reveal", "staff"),
    ("POST", "/v1/checkouts", "staff"), ("POST", "/v1/checkouts", "admin"),
    ("POST", "/v1/checkouts/00000000-0000-4000-8000-000000000001:cancel", "operator"), ("GET", "/v1/payments/00000000-0000-4000-8000-000000000014/events", "customer"),
])
async def test_wrong_role_is_403(client, untouched, bearer, method, path, role):
    r = await client.request(method, path, headers={**bearer(role), "Idempotency-Key": "k"}, json={})
    assert r.status_code == 403 and r.json()["type"] == "permission-denied"


@pytest.mark.parametrize("body, field", [
    (b"{not json", ""), (b'{"name": 42}', "name"), (b'{"name": "x", "owner": "me"}', "owner"),
    (b'[{"name": "x"}]', ""), (b'{"name": "a", "name": "b"}', "name"),
])
async def test_bad_bodies_are_400_naming_the_field(client, untouched, bearer, body, field):
    r = await client.post("/v1/salons", content=body, headers=bearer("admin"))
    assert r.status_code == 400, r.text
    assert r.json().get("field", "") == field


async def test_body_over_one_mib_is_413(client, untouched, bearer):
    big = b'{"name": "' + b"x" * (1024 * 1024) + b'"}'
    r = await client.post("/v1/salons", content=big, headers=bearer("admin"))
    assert r.status_code == 413 and r.json()["type"] == "payload-too-large"

    async def chunks():  # no Content-Length: counted while reading
        yield b'{"name": "'
        for _ in range(20):
            yield b"y" * 65536
        yield b'"}'
    r = await client.post("/v1/salons", content=chunks(), headers=bearer("admin"))
    assert r.status_code == 413


async def test_body_just_under_the_limit_passes(client, fake, bearer):
    codes = ["C%07d" % i for i in range(85_000)]  # ~1 MB of JSON
    body = json.dumps({"batchRef": "b", "codes": codes}).encode()
    assert 1000_000 < len(body) < 1024 * 1024
    r = await client.post("/v1/products/00000000-0000-4000-8000-000000000005/codes:import", content=body, headers=bearer("admin"))
    assert r.status_code == 200, r.text
    assert len(fake.last("ImportCodeBatch").request.codes) == 85_000


async def test_rate_limit_per_customer_with_retry_after(start_gateway, bearer):
    g = await start_gateway(rate_per_second=1, rate_burst=3)
    async with httpx.AsyncClient(base_url=g.url) as c:
        a = bearer("customer", sub="greedy")
        codes = [(await c.get(SLOTS, headers=a)).status_code for _ in range(5)]
        assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
        r = await c.get(SLOTS, headers=a)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["type"] == "rate-limited"
        # Someone else is not affected, and the PSP's webhook has no subject to be limited by.
        assert (await c.get(SLOTS, headers=bearer("customer", sub="polite"))).status_code == 200
        hooks = [(await c.post("/v1/psp/webhooks", content=b"{}")).status_code for _ in range(5)]
        assert hooks == [200] * 5


def shed(route: str, reason: str) -> float:
    return REGISTRY.get_sample_value("cuty_gateway_requests_shed_total",
                                     {"http_route": route, "criticality": "sheddable", "reason": reason}) or 0.0


async def test_random_tokens_from_one_address_are_rate_limited_after_its_burst(start_gateway, untouched):
    """A made-up token is no new caller: the address' bucket is taken before any token is looked at."""
    # 50 at once: the admission limit (it starts at 20, 10 places for reads) is not what is tested.
    g = await start_gateway(address_rate_per_second=0.001, address_rate_burst=20, concurrency_initial=100)
    before = shed(SLOTS_ROUTE, "rate_limited")
    async with httpx.AsyncClient(base_url=g.url) as c:
        answers = []
        for _ in range(8):
            answers += await asyncio.gather(*(c.get(SLOTS, headers={"Authorization": f"Bearer {secrets.token_urlsafe(24)}"})
                                              for _ in range(50)))
    codes = [r.status_code for r in answers]
    assert codes.count(401) == 20 and codes.count(429) == 380
    assert all(int(r.headers["retry-after"]) >= 1 and r.json()["type"] == "rate-limited"
               for r in answers if r.status_code == 429)
    assert shed(SLOTS_ROUTE, "rate_limited") == before + 380


async def test_public_routes_are_limited_per_address_each_kind_apart(start_gateway, bearer):
    g = await start_gateway(address_rate_per_second=0.001, address_rate_burst=3)
    async with httpx.AsyncClient(base_url=g.url) as c:
        hooks = [(await c.post("/v1/psp/webhooks", content=b"{}")).status_code for _ in range(4)]
        assert hooks == [200, 200, 200, 429]
        own = [(await c.get(path)).status_code for path in ("/readyz", "/openapi.json", "/readyz", "/healthz")]
        assert own[:3] == [200, 200, 200] and own[3] == 429
        # A flood of one kind from an address leaves the others' buckets alone.
        assert (await c.get(SLOTS, headers=bearer("customer"))).status_code == 200


async def test_the_address_comes_from_the_trusted_proxy_header_when_configured(start_gateway):
    g = await start_gateway(client_ip_header="X-Forwarded-For", address_rate_per_second=0.001, address_rate_burst=2)
    async with httpx.AsyncClient(base_url=g.url) as c:
        # The client may write anything before the hop the proxy appended: it does not choose its bucket.
        spoofed = [(await c.get("/readyz", headers={"X-Forwarded-For": f"10.9.{i}.1, 203.0.113.5"})).status_code
                   for i in range(3)]
        assert spoofed == [200, 200, 429]
        assert (await c.get("/readyz", headers={"X-Forwarded-For": "203.0.113.6"})).status_code == 200


async def test_the_edge_spans_trace_is_propagated_and_answered(client, fake, bearer):
    r = await client.get(SLOTS, headers=bearer("customer"))
    version, trace_id, span_id, flags = r.headers["traceparent"].split("-")
    assert version == "00" and trace_id == r.headers["x-trace-id"]
    sent = fake.last("ListSlots").metadata["traceparent"]
    assert sent.split("-")[1] == trace_id


async def test_every_answer_has_a_fresh_trace_id(client, bearer):
    rs = await asyncio.gather(client.get(SLOTS, headers=bearer("customer")), client.get("/nope"),
                              client.get(SLOTS), client.get("/healthz"))
    ids = [r.headers["x-trace-id"] for r in rs]
    assert all(len(i) == 32 for i in ids) and len(set(ids)) == 4
    assert all(r.headers["traceparent"].split("-")[1] == i for r, i in zip(rs, ids))


async def test_get_with_a_body_is_refused(client, untouched, bearer):
    r = await client.request("GET", SLOTS, content=b'{"salonId":"x"}', headers=bearer("customer"))
    assert r.status_code == 400


async def test_path_ids_are_decoded_and_passed_verbatim(client, fake, bearer):
    # Percent-encoded characters of an id arrive decoded, and nothing else is done to them.
    r = await client.get("/v1/checkouts/%38f14e45f-ceea-467f-a0e6-6f3a2a1b9c4%64", headers=bearer("customer"))
    assert r.status_code == 200
    assert fake.last("GetCheckout").request.checkout_id == "8f14e45f-ceea-467f-a0e6-6f3a2a1b9c4d"
    # One that is not an id at all is the contract's 400, never a service's concern.
    r = await client.get("/v1/checkouts/1%27%20OR%20%271%27%3D%271", headers=bearer("customer"))
    assert r.status_code == 400 and r.json()["field"] == "checkoutId"


def _post_raw(url: str, head: bytes, body_chunks, *, read_timeout: float = 10) -> bytes:
    """A real socket: send the head and the whole body as fast as the kernel takes it (what a
    client does that does not wait for 100-continue), then read the answer to its end. A reset
    or broken pipe on the way is what the client would see."""
    import socket
    import threading
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as s:
        answer: list[bytes] = []

        def read():
            try:
                while chunk := s.recv(65536):
                    answer.append(chunk)
            except OSError as e:  # a reset while reading
                answer.append(f"<{type(e).__name__}>".encode())
        reader = threading.Thread(target=read)
        reader.start()
        try:
            s.sendall(head)
            for chunk in body_chunks:
                s.sendall(chunk)
        except OSError as e:  # the peer closed before taking the body: the client's broken pipe
            reader.join(read_timeout)
            return b"".join(answer) + f"<send: {type(e).__name__}>".encode()
        reader.join(read_timeout)
        return b"".join(answer)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_two_mib_post_gets_its_413_answer_and_the_connection_is_closed(gw, bearer, framing):
    """Over the limit, the gateway answers 413 while the body still comes, takes a bounded amount
    more so the client is never reset before it has read the answer, and closes the connection."""
    mib2 = 2 * 1024 * 1024
    auth = bearer("admin")["Authorization"]
    for _ in range(5):
        if framing == "content-length":
            head = (f"POST /v1/salons HTTP/1.1\r\nHost: gw\r\nAuthorization: {auth}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {mib2}\r\n\r\n").encode()
            chunks = [b"x" * 65536] * (mib2 // 65536)
        else:
            head = (f"POST /v1/salons HTTP/1.1\r\nHost: gw\r\nAuthorization: {auth}\r\n"
                    "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
            chunks = [b"10000\r\n" + b"x" * 65536 + b"\r\n"] * (mib2 // 65536) + [b"0\r\n\r\n"]
        answer = await asyncio.to_thread(_post_raw, gw.url, head, chunks)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        head_part, _, body = answer.partition(b"\r\n\r\n")
        assert b"connection: close" in head_part.lower(), head_part
        assert json.loads(body)["type"] == "payload-too-large"


async def test_a_clients_traceparent_is_a_link_of_a_new_trace_and_its_baggage_is_dropped(gw, fake, bearer):
    """A client chooses its traceparent: it may not put its spans into our traces (nor choose
    whether we sample), so the edge span starts a trace of its own that links the client's; the
    client's baggage never reaches a service."""
    from opentelemetry import trace as otel
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    otel.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        r = await client.get(SLOTS, headers={**bearer("customer"), "traceparent": incoming,
                                             "baggage": "tenant=other-merchant,role=operator"})
    assert r.status_code == 200
    ours = r.headers["x-trace-id"]
    assert ours != "4bf92f3577b34da6a3ce929d0e0e4736" and r.headers["traceparent"].split("-")[1] == ours
    sent = fake.last("ListSlots").metadata
    assert sent["traceparent"].split("-")[1] == ours and "baggage" not in sent
    (edge,) = [s for s in exporter.get_finished_spans() if s.name == f"GET {SLOTS_ROUTE}"]
    assert edge.parent is None and format(edge.context.trace_id, "032x") == ours
    assert [(format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")) for link in edge.links] == [
        ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")]


async def test_the_gateways_memo_never_keeps_secrets(gw, fake, script, bearer):
    """Answers carrying a client secret or a code's value, and requests carrying plaintext codes,
    are never kept in the gateway's memo tables; answers without them still are."""
    from cuty.payments.v1 import checkout_pb2
    WITH_SECRETS, PLAIN = "00000000-0000-4000-8000-0000000000c1", "00000000-0000-4000-8000-0000000000c2"  # ids keep the contract: UUIDs
    secret, code = "cs_" + secrets.token_hex(8), "CODE-" + secrets.token_hex(6)

    def checkout(request, md):
        out = checkout_pb2.Checkout(id=request.checkout_id)
        if request.checkout_id == WITH_SECRETS:
            out.payment.client_secret = secret
            out.payment.next_action.redirect_url = f"https://psp.example/3ds/{secret}"
            out.codes.add(id="c1", value=code)
        return out
    script("GetCheckout", checkout)
    me = bearer("customer")
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        for _ in range(2):
            r = await client.get(f"/v1/checkouts/{WITH_SECRETS}", headers=me)
            assert r.status_code == 200 and r.json()["payment"]["clientSecret"] == secret
            r = await client.get(f"/v1/checkouts/{PLAIN}", headers=me)
            assert r.status_code == 200
        r = await client.post("/v1/products/00000000-0000-4000-8000-0000000000c3/codes:import", headers=bearer("admin"),
                              json={"batchRef": "b", "codes": [code]})
        assert r.status_code == 200 and list(fake.last("ImportCodeBatch").request.codes) == [code]
    kept = repr(list(gw.app._answers._data.items()) + list(gw.app._requests._data.items()))
    assert secret not in kept and code not in kept
    assert PLAIN in kept  # the memo still works for answers without secrets
