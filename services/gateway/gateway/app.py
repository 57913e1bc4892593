"""The gateway as one ASGI application: every route goes through the same steps.

    match route (404/405) -> server span -> rate limit per client address (429) -> Request-Timeout
    (400) -> admission by criticality (503 overloaded) -> body size (413) -> bearer header (401)
    -> token signature (401) -> rate limit per subject (429) -> role (403) -> Idempotency-Key
    (400) -> transcode and the contract's rules (400) -> time left (504) -> gRPC call over mutual
    TLS, the user as a
    signed assertion, with a deadline -> JSON answer, or the gRPC status as an RFC 9457 problem

The refusals that come by thousands when the platform is flooded (429 per address, 503 overloaded)
are decided before anything costly: no token is verified, no body read, nothing transcoded.

A server-streaming RPC takes the same steps up to the call, and is then answered as Server-Sent
Events (sse.py): a refusal before the stream opens is still a problem.

There is no per-route code: the route table comes from the protos (descriptors.py), who may call
what, how critical it is and how long it may take from policy.py. Plain ASGI rather than a
framework router: the routes are not known until the descriptors are read, and the hot path stays
short (see bench/gateway.py).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
import time

import grpc
from starlette.responses import StreamingResponse

from cutylib import validation
from cutylib.identity import AssertionSigner
from cutylib.tls import GATEWAY, Transport

from . import access as access_log, admission, auth, openapi, problems, tracing
from .admission import AdmissionControl
from .backends import Backends
from .descriptors import Route, load_routes
from .memo import Memo, can_carry_secrets, carries_secrets
from .policy import LOAD, Access, access_for, load_for
from .problems import Problem, bad_request
from .ratelimit import RateLimiter, retry_after_header
from .settings import GatewaySettings
from . import sse
from .transcode import TranscodeError, build_request, dumps, to_json

log = logging.getLogger("gateway")

JSON = "application/json"
PROBLEM_JSON = "application/problem+json"
MAX_IDEMPOTENCY_KEY = 255
# Memo bounds (memo.py): requests whose path, query and body together fit MEMO_MAX_INPUT are
# transcoded once per distinct input; GET answers up to MEMO_MAX_ANSWER bytes are written as JSON
# once per distinct answer.
MEMO_MAX_INPUT = 2048
MEMO_MAX_ANSWER = 64 * 1024
# Request-Timeout: seconds as a plain decimal (no exponent, sign, `nan` or `inf`), at most an hour.
_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\Z")
MAX_REQUEST_TIMEOUT = 3600.0
# Rate-limit buckets per client address, one per kind of route, so that a flood of API calls from
# an address does not starve the PSP's webhooks or the health probes from the same one.
_API, _WEBHOOK, _OWN_ROUTES = 0, 1, 2
# An answer given before the request's body was read (413, 401, 429...): the gateway reads and
# drops at most this much more of the body, for at most this long, before it closes the
# connection, so that the client has read the answer before the close (a close with unread data
# resets the connection, and the client sees a broken pipe instead of the answer).
DRAIN_MAX_BYTES = 8 * 1024 * 1024
DRAIN_MAX_SECONDS = 2.0
# ... except a small body (declared Content-Length up to this), which is read to its end first,
# for at most KEEP_ALIVE_DRAIN_SECONDS: the answer then keeps the connection open. A refusal for
# load comes by thousands a second; closing each connection would make every refused client (or
# the proxy in front) open a new one, and the accept, the close and the new connection's setup cost
# the gateway and the machine many times what the refusal itself does.
KEEP_ALIVE_BODY_BYTES = 64 * 1024
KEEP_ALIVE_DRAIN_SECONDS = 0.5


class ClientGone(Exception):
    pass


class Gateway:
    def __init__(self, settings: GatewaySettings | None = None, routes: list[Route] | None = None):
        self.settings = settings or GatewaySettings()
        self.routes = routes if routes is not None else load_routes()
        self.access: dict[str, Access] = {r.rpc: access_for(r.rpc) for r in self.routes}
        owners = sorted({r.owner for r in self.routes})
        self.backends = Backends({o: self.settings.addr_for(o) for o in owners},
                                 self.settings.transport or Transport.from_env(GATEWAY))
        s = self.settings
        self.limiter = RateLimiter(s.rate_per_second, s.rate_burst)  # per verified subject
        self.addresses = RateLimiter(s.address_rate_per_second, s.address_rate_burst)
        if s.client_ip_hop not in ("first", "last"):
            raise ValueError(f"CUTY_GATEWAY_CLIENT_IP_HOP must be first or last, got {s.client_ip_hop!r}")
        self._ip_header = s.client_ip_header.lower()
        self._ip_hop = -1 if s.client_ip_hop == "last" else 0
        self.admission = AdmissionControl(min_limit=s.concurrency_min, max_limit=s.concurrency_max,
                                          initial_limit=s.concurrency_initial, tolerance=s.latency_tolerance,
                                          target_seconds=s.latency_target_seconds, queue_seconds=s.queue_seconds,
                                          queue_target_seconds=s.queue_target_seconds,
                                          critical_queue_seconds=s.critical_queue_seconds, queue_max=s.queue_max)
        # rpc -> (criticality, the longest its call may take: a client's Request-Timeout is capped by it)
        self.load: dict[str, tuple[str, float]] = {}
        for r in self.routes:
            load = load_for(r.rpc)
            cap = s.sse_max_seconds if r.server_streaming else s.deadline_seconds
            self.load[r.rpc] = (load.criticality, min(load.max_seconds, cap))
            if r.rpc not in LOAD:
                log.warning("route has no criticality in policy.LOAD; shed first", extra={"rpc": r.rpc})
        self.verify = auth.Verifier("" if s.jwks_url else s.jwt_secret, jwks_url=s.jwks_url, issuer=s.jwt_issuer,
                                    audience=s.jwt_audience, leeway=s.jwt_leeway_seconds)
        self.signer = s.signer or AssertionSigner.from_env()
        self._openapi: bytes | None = None
        self._matches = Memo(max_entries=4096, max_bytes=2 * 1024 * 1024)
        self._requests = Memo(max_entries=4096, max_bytes=8 * 1024 * 1024)
        self._answers = Memo(max_entries=1024, max_bytes=32 * 1024 * 1024)
        # RPCs whose requests may hold a secret (plaintext codes) are never memoised; those whose
        # answers may hold one (a client secret, a code's value) only when this answer holds none.
        self._secret_requests = {r.rpc for r in self.routes if can_carry_secrets(r.input_type.DESCRIPTOR)}
        self._secret_answers = {r.rpc for r in self.routes if can_carry_secrets(r.output_type.DESCRIPTOR)}
        for rpc, a in self.access.items():
            if a.roles == frozenset():
                log.warning("route has no access policy; refused to everyone", extra={"rpc": rpc})

    # ASGI ---------------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.backends.start()
                except Exception as e:  # noqa: BLE001 - reported to the server, which exits
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.backends.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def match(self, method: str, raw_path: str) -> tuple[Route | None, dict[str, str], list[str]]:
        """The route of `method raw_path`, its bound path variables (never mutated by callers),
        and, without a route, the methods the path allows; memoised per (method, path)."""
        if len(raw_path) > MEMO_MAX_INPUT:
            return self._match(method, raw_path)
        key = (method, raw_path)
        found = self._matches.get(key)
        if found is None:
            found = self._match(method, raw_path)
            self._matches.put(key, found, 2 * len(raw_path) + 64)
        return found

    def _match(self, method: str, raw_path: str) -> tuple[Route | None, dict[str, str], list[str]]:
        allowed: list[str] = []
        for r in self.routes:
            bound = r.template.match(raw_path)
            if bound is None:
                continue
            if r.http_method == method:
                return r, bound, []
            allowed.append(r.http_method)
        return None, {}, allowed

    async def _http(self, scope, receive, send) -> None:
        t0 = time.perf_counter()
        access_log.subject.set("")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope["method"]
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").split("?", 1)[0]
        query = scope.get("query_string", b"").decode("latin-1")
        route, bound, allowed = self.match(method, raw_path)
        unread = None
        if "transfer-encoding" in headers or headers.get("content-length", "0") != "0":
            receive = unread = _BodyReader(receive)
        route_name = route.template.source if route else (raw_path if raw_path in _OWN else "(unmatched)")
        name = f"{method} {route_name}"
        # Health probes start no trace: every few seconds per replica, they would bury the real ones.
        with (tracing.passive_span(headers) if raw_path == "/healthz" else tracing.start_server_span(name, headers)) as span:
            tp, trace_id = tracing.traceparent(span)
            extra: dict[str, str] = {}
            stream: StreamingResponse | None = None
            shed = False
            try:
                if self.addresses.enabled:
                    kind = _OWN_ROUTES if route is None else _WEBHOOK if self.access[route.rpc].public else _API
                    self._rate_limit(self.addresses, (kind, self.client_address(scope, headers)), route_name, route)
                if route is not None and route.server_streaming:
                    stream = await self._stream(route, bound, query, headers, receive, trace_id, t0)
                    status, body, ctype = 200, b"", sse.MEDIA_TYPE
                elif route is not None:
                    status, body, ctype = 200, await self._rpc(route, bound, query, headers, receive, t0), JSON
                elif raw_path in _OWN and method == "GET":
                    status, body, ctype = await _OWN[raw_path](self)
                elif allowed or raw_path in _OWN:
                    raise Problem(405, "method-not-allowed", f"{method} is not allowed here",
                                  headers={"allow": ", ".join(sorted(set(allowed) or {"GET"}))})
                else:
                    raise Problem(404, "not-found", f"no route for {method} {raw_path}")
            except Problem as p:
                status, body, ctype, extra = p.status, p.body(trace_id), PROBLEM_JSON, p.headers
                shed = p.type == problems.OVERLOADED  # counted, not logged: refusals come by thousands
            except ClientGone:
                return
            except Exception:  # noqa: BLE001 - a gateway bug must still answer with a problem
                log.exception("unhandled error", extra={"route": name})
                p = Problem(500, "internal", "the gateway failed; quote the trace id when reporting it")
                status, body, ctype = 500, p.body(trace_id), PROBLEM_JSON
            span.set_attribute("http.response.status_code", status)
            if status >= 500 and route is not None and not shed:
                log.warning("request failed", extra={"route": name, "status": status})
        if stream is not None:
            if tp:
                stream.headers["traceparent"], stream.headers["x-trace-id"] = tp, trace_id
            try:
                await stream(scope, receive, send)
            finally:
                access_log.record(method, route_name, status, time.perf_counter() - t0, trace_id,
                                  log_line=self.settings.access_log)
            return
        out = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store")]
        if tp:
            out += [(b"traceparent", tp.encode()), (b"x-trace-id", trace_id.encode())]
        out += [(k.encode(), v.encode()) for k, v in extra.items()]
        if unread is not None and not unread.done and _small_body(headers):
            # Answered before a small body was read: read it now, and the connection stays open.
            await _drain(unread, KEEP_ALIVE_BODY_BYTES, KEEP_ALIVE_DRAIN_SECONDS)
        if unread is not None and not unread.done:
            # Answered before the body was read: answer, take a bounded amount more of the body,
            # then close (docs/security.md, "A refused body still gets its answer").
            out.append((b"connection", b"close"))
            await send({"type": "http.response.start", "status": status, "headers": out})
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await _drain(unread, DRAIN_MAX_BYTES, DRAIN_MAX_SECONDS)
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.start", "status": status, "headers": out})
            await send({"type": "http.response.body", "body": body})
        access_log.record(method, route_name, status, time.perf_counter() - t0, trace_id,
                          log_line=self.settings.access_log)

    # The one generic route handler ---------------------------------------------------------------
    async def _rpc(self, route: Route, bound: dict[str, str], query: str, headers: dict[str, str], receive,
                   t0: float) -> bytes:
        request, metadata, timeout, budget, criticality = await self._admit_and_prepare(
            route, bound, query, headers, receive, t0)
        adm = self.admission
        started, outcome = adm.clock(), admission.OK
        try:
            raw = await self.backends.call(route, request, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            p = problems.from_rpc_error(e, service=route.owner, deadline=budget)
            outcome = self._outcome(route, criticality, p)
            raise p from None
        finally:
            adm.release(route.rpc, started, outcome)
        if route.http_method != "GET" or len(raw) > MEMO_MAX_ANSWER:
            # A write's answer is new every time (ids, states): nothing to reuse.
            return to_json(route.output_type.FromString(raw))
        # The same answer bytes of the same RPC are the same JSON: a read repeated by many
        # clients (a salon's day, a product) is written once until its answer changes.
        key = (route.rpc, raw)
        body = self._answers.get(key)
        if body is None:
            answer = route.output_type.FromString(raw)
            body = to_json(answer)
            if route.rpc not in self._secret_answers or not carries_secrets(answer):
                self._answers.put(key, body, 2 * len(raw) + len(body))
        return body

    async def _stream(self, route: Route, bound: dict[str, str], query: str, headers: dict[str, str], receive,
                      trace_id: str, t0: float) -> StreamingResponse:
        """A server-streaming route: the call opened (or its refusal as a problem), then its
        messages as Server-Sent Events (sse.py); the call is cancelled when the client leaves.
        Admission counts the opening only: an open stream costs the service little, and one that
        held a place for its hour would leave none to the calls the limit is measured on."""
        request, metadata, timeout, budget, criticality = await self._admit_and_prepare(
            route, bound, query, headers, receive, t0)
        expires_in = None
        if not self.access[route.rpc].public:
            # The stream ends when its token would no longer be accepted (sse.py); the call's own
            # deadline a moment later bounds the service's side even if the gateway's is missed.
            expires_in = self.verify.seconds_left(auth.token_of(headers.get("authorization")))
            timeout = min(timeout, max(expires_in, 0) + 1.0)
        call = self.backends.stream(route, request, metadata=metadata, timeout=timeout)
        adm = self.admission
        started, outcome = adm.clock(), admission.OK
        try:
            first = await sse.opened(call, service=route.owner, deadline=budget)
        except Problem as p:
            outcome = self._outcome(route, criticality, p)
            raise
        finally:
            adm.release(route.rpc, started, outcome)
        body = sse.events(call, first, heartbeat=self.settings.sse_heartbeat_seconds, service=route.owner,
                          deadline=budget, trace_id=trace_id, expires_in=expires_in)
        # no-transform / X-Accel-Buffering: proxies must pass each event on as it comes.
        return StreamingResponse(body, media_type=sse.MEDIA_TYPE, headers={
            "cache-control": "no-store, no-transform", "x-accel-buffering": "no"})

    async def _admit_and_prepare(self, route: Route, bound: dict[str, str], query: str, headers: dict[str, str],
                                 receive, t0: float) -> tuple[bytes, tuple, float, float, str]:
        """Admission first, then every other check of the route: (the serialized request, the call's
        metadata, its timeout, the request's budget, its criticality). A refusal for load (503)
        costs no token verification, no body read and no transcoding: past capacity the gateway
        refuses several times more requests than it admits, and each must cost almost nothing.
        An admitted request that fails a later check (401, 403, 400, 413, 504) gives its place
        back unmeasured; one that reaches the call gives it back in `release` after it."""
        criticality, budget, since = self._budget(route, headers, t0)
        await self._admit(route, criticality, budget)
        try:
            request, metadata = await self._prepare(route, bound, query, headers, receive)
            timeout = self._time_left(route, criticality, budget, since)
        except BaseException:
            self.admission.cancel()
            raise
        return request, metadata, timeout, budget, criticality

    async def _prepare(self, route: Route, bound: dict[str, str], query: str, headers: dict[str, str],
                       receive) -> tuple[bytes, tuple]:
        """Every check of a route up to the call: the serialized request message and the call's metadata."""
        access = self.access[route.rpc]
        limit = self.settings.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise bad_request("Content-Length", f"Content-Length must be a number, got {declared!r}")
            if int(declared) > limit:
                raise _too_large(limit, int(declared))
        metadata: list[tuple[str, str]] = []
        if not access.public:
            token = auth.token_of(headers.get("authorization"))
            # Verified first: a limit keyed by anything the client chooses freely (the token
            # itself) would hand every made-up token a fresh burst. Floods of bad tokens meet the
            # per-address limit before any signature is checked.
            who = await self.verify(token)
            if self.limiter.enabled:
                self._rate_limit(self.limiter, who.subject, route.template.source, route)
            if who.role not in access.roles:
                raise Problem(403, "permission-denied", f"role {who.role!r} may not call {route.http_method} "
                              f"{route.template.source}; allowed: {', '.join(sorted(access.roles)) or 'nobody'}")
            access_log.subject.set(who.subject)
            metadata += self.signer.metadata(who, route.owner)  # for that service alone
        body = await _read_body(receive, limit)
        if route.body == "" and body.strip():
            raise bad_request("", f"{route.http_method} {route.template.source} takes no request body")
        if access.idempotency_key:
            metadata.append(("idempotency-key", _idempotency_key(headers.get("idempotency-key"))))
        for header, key in access.forward_headers:
            if header in headers:
                metadata.append((key, _forwarded(header, headers[header])))
        metadata += tracing.inject()
        return self._request(route, bound, query, body), tuple(metadata)

    # Load: who may use the backends now, and for how long ------------------------------------------
    def client_address(self, scope, headers: dict[str, str]) -> str:
        """The client's address: the configured trusted proxy header's first or last hop, else the
        socket peer. An IPv6 address stands for its /64 (one customer's network gets as many
        addresses as it likes), an IPv4-mapped one for its IPv4 address."""
        addr = ""
        if self._ip_header:
            forwarded = headers.get(self._ip_header)
            if forwarded:
                addr = forwarded.split(",")[self._ip_hop].strip()[:64]
        if not addr:
            client = scope.get("client")
            addr = client[0] if client else ""
        return _network(addr) if ":" in addr else addr

    def _rate_limit(self, limiter: RateLimiter, key, route_name: str, route: Route | None) -> None:
        wait = limiter.take(key)
        if wait:
            access_log.shed(route_name, self.load[route.rpc][0] if route else "none", "rate_limited")
            raise Problem(429, "rate-limited", f"too many requests; retry in {wait:.1f} s",
                          headers={"retry-after": retry_after_header(wait)})

    def _budget(self, route: Route, headers: dict[str, str], t0: float) -> tuple[str, float, float | None]:
        """The route's criticality; how long its call may take: the route's maximum, or less when
        the client says so in Request-Timeout (a 400 naming the header when malformed); and since
        when that time runs: the client's from the request's arrival (t0), the route's own from
        the call (a large body's slow upload does not eat it)."""
        criticality, longest = self.load[route.rpc]
        raw = headers.get("request-timeout")
        if raw is None:
            return criticality, longest, None
        return criticality, min(longest, _request_timeout(raw)), t0

    async def _admit(self, route: Route, criticality: str, budget: float) -> None:
        """A place for the request among the backend calls in flight, or the request refused:
        503 `overloaded` when its criticality's share of the concurrency limit is in use and no
        place frees within its short wait (admission.py)."""
        if not await self.admission.acquire(criticality, budget):
            access_log.shed(route.template.source, criticality, "overloaded")
            raise problems.overloaded("the platform is at capacity and serves purchases already under way first; "
                                      "nothing was done, retry after Retry-After", admission.retry_after())

    @staticmethod
    def _time_left(route: Route, criticality: str, budget: float, since: float | None) -> float:
        """The call's deadline, what is left of `budget` (counted from `since` when given); 504 when
        nothing is left."""
        left = budget if since is None else budget - (time.perf_counter() - since)
        if left <= 0:
            access_log.shed(route.template.source, criticality, "deadline")
            raise Problem(504, "deadline-exceeded", f"the request's time ({budget:g} s) ran out before the gateway "
                          "called the service: nothing was done; retry with more time")
        return left

    def _outcome(self, route: Route, criticality: str, p: Problem) -> int:
        """A failed call's sign for the concurrency limit (and the shedding count): an answered
        error is a completion, but no sample of the route's no-load latency."""
        if p.status == 504:
            return admission.TIMEOUT
        if p.status == 503:
            if p.type == problems.OVERLOADED:
                access_log.shed(route.template.source, criticality, "backend_overloaded")
            return admission.OVERLOAD
        return admission.ERROR

    def _request(self, route: Route, bound: dict[str, str], query: str, body: bytes) -> bytes:
        """The request message, transcoded and checked against its contract, serialized;
        memoised per distinct (RPC, path variables, query, body) when they are small, so a request
        repeated by many clients is checked once. A refused request (400) is never memoised."""
        key = (route.rpc, tuple(bound.items()), query, body)
        size = len(query) + len(body) + sum(len(k) + len(v) for k, v in bound.items())
        memo = size <= MEMO_MAX_INPUT and route.rpc not in self._secret_requests
        if memo:
            data = self._requests.get(key)
            if data is not None:
                return data
        try:
            message = build_request(route, bound, query, body)
        except TranscodeError as e:
            raise bad_request(e.field, e.message) from None
        # The contract's rules (the protos' buf.validate annotations), as the service would check
        # them: the same 400, and a request that breaks them never reaches a service.
        found = validation.violations(message)
        if found:
            raise problems.invalid_request(found)
        data = message.SerializeToString()
        if memo:
            self._requests.put(key, data, 2 * size + len(data) + 64)
        return data

    # The gateway's own routes --------------------------------------------------------------------
    async def healthz(self) -> tuple[int, bytes, str]:
        services = await self.backends.health(self.settings.health_timeout_seconds)
        ok = all(s == "SERVING" for s in services.values())
        return (200 if ok else 503), dumps({"status": "SERVING" if ok else "NOT_SERVING", "services": services}), JSON

    async def readyz(self) -> tuple[int, bytes, str]:
        """Readiness is the gateway's own ability to serve: it runs and its channels exist. One
        backend being down must not take every gateway out of rotation (the PSP's webhooks, other
        routes); `/healthz` keeps the per-backend detail for people."""
        ok = bool(self.backends.channels)
        return (200 if ok else 503), dumps({"status": "SERVING" if ok else "NOT_SERVING"}), JSON

    async def openapi_json(self) -> tuple[int, bytes, str]:
        if self._openapi is None:
            self._openapi = dumps(openapi.document(self.routes, self.access))
        return 200, self._openapi, JSON


_OWN = {"/healthz": Gateway.healthz, "/readyz": Gateway.readyz, "/openapi.json": Gateway.openapi_json}


def _too_large(limit: int, size: int | None = None) -> Problem:
    got = f", got {size} bytes" if size is not None else ""
    return Problem(413, "payload-too-large", f"the request body may be at most {limit} bytes{got}",
                   extra={"maxBytes": limit})


class _BodyReader:
    """`receive` of a request that has a body, noting when the body has been read to its end."""
    __slots__ = ("receive", "done")

    def __init__(self, receive):
        self.receive = receive
        self.done = False

    async def __call__(self):
        msg = await self.receive()
        if msg["type"] == "http.disconnect" or not msg.get("more_body"):
            self.done = True
        return msg


def _small_body(headers: dict[str, str]) -> bool:
    """A body whose declared length is at most KEEP_ALIVE_BODY_BYTES (not chunked)."""
    declared = headers.get("content-length")
    return ("transfer-encoding" not in headers and declared is not None and declared.isdigit()
            and int(declared) <= KEEP_ALIVE_BODY_BYTES)


async def _drain(reader: _BodyReader, max_bytes: int, max_seconds: float) -> None:
    """Read and drop the rest of a body: at most `max_bytes`, for at most `max_seconds`."""
    # asyncio.timeout, not wait_for: no task of its own (a small body's drain is on every refusal).
    taken = 0
    try:
        async with asyncio.timeout(max_seconds):
            while not reader.done and taken <= max_bytes:
                taken += len((await reader()).get("body", b""))
    except TimeoutError:
        pass


async def _read_body(receive, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it passes `limit`, even without Content-Length."""
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone()
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


def _request_timeout(raw: str) -> float:
    value = raw.strip()
    seconds = float(value) if len(value) <= 32 and _SECONDS.match(value) else math.nan
    if not 0 < seconds <= MAX_REQUEST_TIMEOUT:  # NaN fails too
        raise bad_request("Request-Timeout", f"Request-Timeout must be a number of seconds above 0 and at most "
                          f"{MAX_REQUEST_TIMEOUT:g}, such as 2.5; got {raw[:40]!r}")
    return seconds


def _network(addr: str) -> str:
    try:
        ip = ipaddress.IPv6Address(addr.strip("[]"))
    except ValueError:
        return addr
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return ip.exploded[:19]  # the first four groups: the /64


def _forwarded(name: str, value: str) -> str:
    """A header passed on as gRPC metadata, which carries printable ASCII only: anything else
    (obs-text bytes, control characters) is the client's mistake, a 400, never a failed call."""
    if not (value.isascii() and value.isprintable()):
        raise bad_request(name, f"the {name} header must be printable ASCII")
    return value


def _idempotency_key(raw: str | None) -> str:
    key = (raw or "").strip()
    if not key:
        raise bad_request("Idempotency-Key", "this request needs an Idempotency-Key header (a unique value per "
                          "intended operation, reused only to retry it)", type_="idempotency-key-required")
    if len(key) > MAX_IDEMPOTENCY_KEY or not key.isascii() or not key.isprintable():
        raise bad_request("Idempotency-Key", f"the Idempotency-Key must be 1..{MAX_IDEMPOTENCY_KEY} printable "
                          f"ASCII characters, got {len(key)} characters")
    return key
