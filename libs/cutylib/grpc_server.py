"""gRPC aio server bootstrap: mutual TLS, who may call what, health, reflection, the error mapping, graceful stop."""
from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
from typing import Awaitable, Callable, Iterable, Mapping

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from . import clients as internal_clients
from . import deadlines, principal, telemetry, tokens, validation
from .access import access_for, rpc_name
from .config import env_int, env_str
from .dbwatch import UNREACHABLE, DatabaseWatch
from .errors import InvalidArgument, PermissionDenied, ResourceExhausted, Unauthenticated
from .grpc_errors import status_for_exception
from .grpc_metrics import GrpcMetricsInterceptor, WrappedHandlers, rewrap, stream_of
from .metrics import metrics_enabled
from .identity import ASSERTION_KEY, AssertionVerifier
from .tls import GATEWAY, Transport, peer_service

log = logging.getLogger(__name__)


Callers = Mapping[str, Iterable[str]]  # RPC name -> identities of the services allowed to call it

# Served to any verified peer (health), or only in development (reflection).
_OPEN_SERVICES = (health.SERVICE_NAME, reflection.SERVICE_NAME)
# The metadata of a call's idempotency key (the gateway forwards the HTTP Idempotency-Key as it).
IDEMPOTENCY_KEY = "idempotency-key"
# Seconds the token an internal client forwarded for this call is still accepted (None: no such
# token): a stream opened with it must end by then, as the gateway ends its streams.
_FORWARDED_TOKEN_LEFT: contextvars.ContextVar[float | None] = contextvars.ContextVar("cuty_forwarded_token_left",
                                                                                      default=None)


class Trust:
    """Who may call what on one server, failing closed: per RPC, the services whose certificates may
    call it (`callers`), whether a service other than the gateway acts there as `system`
    (`system`), and which user roles the gateway may bring (`roles`); the user assertion verifier
    (assertions for this server alone: `cuty-<name>`).

    - A user comes only from the gateway: an assertion from any other peer is refused, whatever
      its signature (a service forwards no user; an intruder in one service cannot replay one).
    - `system` is granted per RPC: a peer other than the gateway, listed for the RPC, calling
      without a user, is `system` where the RPC is in `system`, and refused elsewhere.
    - The gateway without a user is `anonymous` (every role check refuses it; the PSP's webhook
      and health need none).
    - An internal client (cutylib.clients, `CUTY_INTERNAL_CLIENTS`) is no service: it reaches the
      public RPCs only (those with a gateway route), with the roles the route admits, as the user
      its configuration names or as the user whose token it forwards (verified as the gateway
      verifies it, cutylib.tokens); never `system`, never with a gateway assertion."""

    def __init__(self, name: str, verifier: AssertionVerifier | None = None, *,
                 clients: dict[str, internal_clients.InternalClient] | None = None,
                 token_verifier: tokens.TokenVerifier | None = None):
        self.name = name
        self.allowed: dict[str, frozenset[str]] = {}
        self.system: set[str] = set()
        self.roles: dict[str, frozenset[str]] = {}
        self._verifier = verifier
        # Read at start: a malformed configuration stops the process, naming the entry.
        self.clients = internal_clients.from_env() if clients is None else clients
        self._tokens = token_verifier

    @property
    def verifier(self) -> AssertionVerifier:
        if self._verifier is None:
            self._verifier = AssertionVerifier.from_env(self.name)
        return self._verifier

    @property
    def tokens(self) -> tokens.TokenVerifier:
        if self._tokens is None:
            self._tokens = tokens.TokenVerifier.from_env()
        return self._tokens

    def add(self, service: ServiceDescriptor, callers: Callers, *, system: Iterable[str] = (),
            roles: Iterable[str] = principal.USER_ROLES) -> None:
        methods = {m.name for m in service.methods}
        missing, unknown = methods - set(callers), set(callers) - methods
        if missing or unknown:
            raise ValueError(f"caller table of {service.full_name} must name every RPC once: "
                             f"missing {sorted(missing)}, unknown {sorted(unknown)}")
        system = set(system)
        if system - methods:
            raise ValueError(f"system RPCs of {service.full_name} that it does not have: {sorted(system - methods)}")
        roles = frozenset(roles)
        if roles - set(principal.USER_ROLES):
            raise ValueError(f"user roles of {service.full_name} that no user has: {sorted(roles - set(principal.USER_ROLES))}")
        for method, who in callers.items():
            path = f"/{service.full_name}/{method}"
            self.allowed[path] = frozenset(who)
            self.roles[path] = roles
            if method in system:
                self.system.add(path)

    async def principal(self, method: str, context, metadata) -> principal.Principal:
        """The caller of `method`, or a PERMISSION_DENIED / UNAUTHENTICATED / INVALID_ARGUMENT error."""
        peer = peer_service(context, metadata)
        if method.startswith(_OPEN_PREFIXES):
            return principal.ANONYMOUS
        allowed = self.allowed.get(method, frozenset())
        if peer is not None and peer not in allowed and peer in self.clients:
            return await self._client(self.clients[peer], method, context, metadata)
        if peer is None or peer not in allowed:
            self._refused(method, context, peer, "not in the caller table")
            if peer is not None and peer not in internal_clients.RESERVED:
                raise PermissionDenied(f"{peer!r} is neither a service allowed to call {method} nor an internal "
                                       f"client registered in {internal_clients.ENV} (docs/clients.md)")
            raise PermissionDenied(f"service {peer or '(unknown)'!r} may not call {method}")
        assertion = principal.metadata_value(metadata, ASSERTION_KEY)
        if assertion:
            if peer != GATEWAY:
                self._refused(method, context, peer, "a user from a service other than the gateway")
                raise PermissionDenied(f"only the gateway brings users; service {peer!r} may not")
            who = self.verifier.verify(assertion)
            if who.role not in self.roles[method]:
                self._refused(method, context, peer, f"role {who.role} is not allowed here")
                raise PermissionDenied(f"role {who.role!r} may not use {self.name}")
            return who
        if peer == GATEWAY:
            return principal.ANONYMOUS
        if method not in self.system:
            self._refused(method, context, peer, "system on an RPC not granted to system")
            raise PermissionDenied(f"service {peer!r} may not act as system on {method}")
        return principal.SYSTEM

    async def _client(self, client: internal_clients.InternalClient, method: str, context,
                      metadata) -> principal.Principal:
        """An internal client's principal on `method`: a public RPC only, as itself or as the user
        whose token it forwards, in a role the RPC's route admits."""
        peer = client.identity
        access = access_for(rpc_name(method))
        if GATEWAY not in self.allowed.get(method, ()) or not access.roles:
            self._refused(method, context, peer, "an internal client on an RPC outside the public API")
            raise PermissionDenied(f"internal client {peer!r} may call only the public API; {method} is not part of it")
        if principal.metadata_value(metadata, ASSERTION_KEY):
            self._refused(method, context, peer, "a user assertion from an internal client")
            raise PermissionDenied("only the gateway brings user assertions (cuty-user); an internal client "
                                   f"forwards its user's token in metadata '{tokens.BEARER_KEY}'")
        bearer = principal.metadata_value(metadata, tokens.BEARER_KEY)
        if bearer:
            if not client.user_roles:
                self._refused(method, context, peer, "a user's token from a client not configured for users")
                raise PermissionDenied(f"internal client {peer!r} may not act for users (no 'users' in its "
                                       f"{internal_clients.ENV} entry)")
            token = tokens.bearer_of(bearer)
            who = await self.tokens(token)
            _FORWARDED_TOKEN_LEFT.set(self.tokens.seconds_left(token))
            if who.role not in client.user_roles:
                self._refused(method, context, peer, f"a user of role {who.role} it may not bring")
                raise PermissionDenied(f"internal client {peer!r} may not act for users of role {who.role!r}")
        elif client.acts_as is None:
            raise Unauthenticated(f"internal client {peer!r} acts only for users: forward the user's token in "
                                  f"metadata '{tokens.BEARER_KEY}: Bearer <token>'")
        else:
            who = client.acts_as
        admitted = access.roles & self.roles[method]
        if who.role not in admitted:
            self._refused(method, context, peer, f"role {who.role} is not allowed here")
            raise PermissionDenied(f"role {who.role!r} may not call {method}; it needs one of "
                                   f"{', '.join(sorted(admitted))}")
        if access.idempotency_key and not principal.metadata_value(metadata, IDEMPOTENCY_KEY).strip():
            raise InvalidArgument(IDEMPOTENCY_KEY, f"{method} needs an idempotency key (metadata "
                                                   f"'{IDEMPOTENCY_KEY}'); a retry sends the same one")
        return who

    @staticmethod
    def _refused(method: str, context, peer: str | None, why: str) -> None:
        log.warning("caller refused", extra={"rpc": method, "peer": peer or "(unknown)",
                                             "address": context.peer(), "why": why})


# Unary calls one process serves at once (CUTY_GRPC_MAX_CONCURRENT_RPCS). A call holds one of the
# pool's 20 connections (CUTY_DB_POOL_MAX) for only part of its time (the rest is TLS, protobuf
# and Python on one event loop), so a few calls per connection keep both the pool and the loop
# busy; 128 (about 6 per connection) does, and the benchmarks' 64 in flight stay below it. At
# about 1 ms of server CPU per call (bench/booking.py), 128 is at most ~130 ms of queue: beyond
# that, waiting only spends the callers' deadlines, so grpc refuses the call at once.
DEFAULT_MAX_CONCURRENT_RPCS = 128
# Streams open at once (CUTY_GRPC_MAX_CONCURRENT_STREAMS): as many as payments' own cap of watch
# streams (CUTY_MAX_WATCH_STREAMS); a stream holds no pooled connection while it waits.
DEFAULT_MAX_STREAMS = 2000

LIVENESS = "liveness"  # a health name that only says the process runs (Kubernetes liveness probes)
# How long stop() waits for its background workers to end once cancelled (each ends at its next await).
BACKGROUND_STOP_SECONDS = 10.0
_OPEN_PREFIXES = tuple(f"/{s}/" for s in _OPEN_SERVICES)


class TrustAndErrorInterceptor(grpc.aio.ServerInterceptor):
    """Decides who calls (Trust), records the call's deadline (cutylib.deadlines), refuses a call
    whose deadline is (nearly) spent or that is cancelled already, caps open streams, and maps
    escaping domain errors to status codes.

    The single place where exceptions become gRPC statuses, so handlers just raise.

    `max_streams`: how many calls that stream (either way: WatchCheckout, ImportCodes, health
    watches) may be open at once; beyond it a stream is refused with RESOURCE_EXHAUSTED. grpc's own
    cap (`maximum_concurrent_rpcs`) counts every call, so GrpcServer sizes it as the unary cap plus
    this one: long-lived streams cannot take the places meant for unary calls.
    """

    def __init__(self, trust: Trust, max_streams: int | None = None):
        self.trust = trust
        self.max_streams = max_streams
        self.open_streams = 0
        self._handlers = WrappedHandlers(self._wrap)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self._handlers.get(handler_call_details.method, handler)

    def _admit_stream(self) -> None:
        if self.max_streams is not None and self.open_streams >= self.max_streams:
            raise ResourceExhausted(f"this server has {self.max_streams} streams open, as many as it takes; "
                                    "retry later", reason="too-many-streams")
        self.open_streams += 1

    def _wrap(self, method: str, handler):
        trust = self.trust
        # Every request message is checked against its contract (the protos' buf.validate rules,
        # cutylib.validation) before the handler sees it; health and reflection have no rules.
        checked = not method.startswith(_OPEN_PREFIXES)
        streamed_in = bool(handler.request_streaming)
        # Calls that stream either way count against max_streams (stream-unary ones are wrapped
        # by wrap_unary: one answer, but a request stream that may last).
        streams = bool(handler.request_streaming or handler.response_streaming)

        async def _fail(exc: BaseException, context) -> None:
            status = status_for_exception(exc)
            if status is None:
                # The detail (exception, stack) goes to the log with the trace id; the caller gets a
                # stable message that names nothing internal.
                log.exception("unhandled error in %s", method)
                await context.abort(grpc.StatusCode.INTERNAL, "internal error; quote the trace id when reporting it")
            else:
                if status.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED):
                    log.warning("%s: %s", method, status.details)
                await context.abort_with_status(status)

        async def _enter(context, metadata):
            """The call's principal and deadline, once it is known to be worth starting."""
            seconds_left = context.time_remaining()
            if deadlines.spent(seconds_left):
                # Its caller gives up before an answer could reach it: start nothing.
                raise deadlines.exceeded("start the call")
            if context.cancelled():
                raise asyncio.CancelledError()
            _FORWARDED_TOKEN_LEFT.set(None)
            who = await trust.principal(method, context, metadata)
            return principal.set_current(who), deadlines.start(seconds_left)

        def wrap_unary(behavior):
            async def wrapped(request_or_iterator, context):
                tokens = None
                admitted = False
                metadata = context.invocation_metadata()
                try:
                    tokens = await _enter(context, metadata)
                    if checked:
                        if streamed_in:
                            request_or_iterator = _checked_stream(request_or_iterator)
                        else:
                            validation.check(request_or_iterator)
                    if streams:
                        self._admit_stream()
                        admitted = True
                    if telemetry.propagating_by_hand():
                        with telemetry.server_span(method, metadata):
                            return await behavior(request_or_iterator, context)
                    return await behavior(request_or_iterator, context)
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    await _fail(exc, context)
                finally:
                    if admitted:
                        self.open_streams -= 1
                    if tokens is not None:
                        principal._current.reset(tokens[0])
                        deadlines.end(tokens[1])
            return wrapped

        def wrap_stream(behavior):
            async def wrapped(request_or_iterator, context):
                tokens = None
                admitted = False
                metadata = context.invocation_metadata()
                try:
                    tokens = await _enter(context, metadata)
                    _stream_within_token(context)
                    if checked:
                        if streamed_in:
                            request_or_iterator = _checked_stream(request_or_iterator)
                        else:
                            validation.check(request_or_iterator)
                    self._admit_stream()
                    admitted = True
                    async for item in stream_of(behavior(request_or_iterator, context)):
                        yield item
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:  # noqa: BLE001
                    await _fail(exc, context)
                finally:
                    if admitted:
                        self.open_streams -= 1
                    if tokens is not None:
                        principal._current.reset(tokens[0])
                        deadlines.end(tokens[1])
            return wrapped

        return rewrap(handler, wrap_unary, wrap_stream)


def _stream_within_token(context) -> None:
    """A stream opened with a token an internal client forwarded must end when the token does (its
    deadline at most the token's remaining life, as the gateway sets it for its own streams):
    otherwise a token would keep a live stream open past its expiry."""
    left = _FORWARDED_TOKEN_LEFT.get()
    if left is None:
        return
    remaining = context.time_remaining()
    if remaining is None or remaining > left + 1:
        raise Unauthenticated(f"a stream opened with a forwarded token must end when the token does: set the "
                              f"call's deadline to at most {max(left, 0):.0f} s (the token's remaining life)")


async def _checked_stream(requests):
    """A client stream whose every message is checked against its contract as it arrives; the
    first bad one ends the call with INVALID_ARGUMENT. The stream reads as one message: an item of
    a repeated field is named by its place across the whole stream (`codes[1234]` is the 1235th
    code sent, whichever message carried it)."""
    offsets: dict[str, int] = {}
    async for m in requests:
        found = validation.violations(m)
        if found:
            raise validation.RequestInvalid([(_across(f, offsets), d) for f, d in found])
        for f in m.DESCRIPTOR.fields:
            if f.is_repeated:
                offsets[f.name] = offsets.get(f.name, 0) + len(getattr(m, f.name))
        yield m


def _across(path: str, offsets: dict[str, int]) -> str:
    """`codes[34]` of a message after 1200 codes already streamed -> `codes[1234]`."""
    head, sep, rest = path.partition("[")
    if not sep or head not in offsets or "." in head:
        return path
    index, close, tail = rest.partition("]")
    return f"{head}[{offsets[head] + int(index)}]{tail}" if close and index.isdigit() else path


BackgroundTask = Callable[[], Awaitable[None]]


class GrpcServer:
    """A gRPC aio server on mutual TLS with per-RPC caller tables, health checking, reflection
    (development only) and background workers.

        server = GrpcServer("booking", port)
        booking_pb2_grpc.add_BookingServiceServicer_to_server(servicer, server.server)
        server.add_service(booking_pb2.DESCRIPTOR.services_by_name["BookingService"], CALLERS,
                           system=SYSTEM_RPCS, roles=USER_ROLES)
        server.add_background(sweeper.run)
        await server.run_until_signal()

    `transport`: mutual TLS as `name` (default: Transport.from_env).
    """

    def __init__(self, name: str, port: int, *, host: str = "0.0.0.0", grace_seconds: float = 5.0,
                 interceptors: Iterable[grpc.aio.ServerInterceptor] = (), transport: Transport | None = None,
                 verifier: AssertionVerifier | None = None, max_concurrent_rpcs: int | None = None,
                 max_streams: int | None = None):
        self.name = name
        self.grace_seconds = grace_seconds
        self.transport = transport or Transport.from_env(name)
        self.trust = Trust(name, verifier)
        age_ms = env_int("CUTY_GRPC_MAX_CONNECTION_AGE_SECONDS", 300) * 1000
        # No unbounded queue inside the service: beyond max_concurrent_rpcs unary calls (and
        # max_streams streams) grpc answers RESOURCE_EXHAUSTED at once, before any handler runs, so
        # an overload is turned away while its callers can still go elsewhere or back off. 0: no cap.
        self.max_concurrent_rpcs = env_int("CUTY_GRPC_MAX_CONCURRENT_RPCS", DEFAULT_MAX_CONCURRENT_RPCS) \
            if max_concurrent_rpcs is None else max_concurrent_rpcs
        self.max_streams = env_int("CUTY_GRPC_MAX_CONCURRENT_STREAMS", DEFAULT_MAX_STREAMS) \
            if max_streams is None else max_streams
        self.errors = TrustAndErrorInterceptor(self.trust, max_streams=self.max_streams or None)
        self.server = grpc.aio.server(
            interceptors=[*([GrpcMetricsInterceptor()] if metrics_enabled() else []),
                          self.errors, *interceptors],
            # grpc counts every call; streams are capped apart (TrustAndErrorInterceptor), so the
            # unary calls keep max_concurrent_rpcs places whatever the streams do.
            maximum_concurrent_rpcs=(self.max_concurrent_rpcs + self.max_streams) if self.max_concurrent_rpcs else None,
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                     # Connections are closed (gracefully) after this age, so clients re-resolve the
                     # name and reach pods added since; keepalive pings are allowed every 20 s.
                     ("grpc.max_connection_age_ms", age_ms), ("grpc.max_connection_age_grace_ms", 30_000),
                     ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
                     ("grpc.keepalive_permit_without_calls", 1)],
        )
        self.port = self.transport.add_port(self.server, f"{host}:{port}")
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.health_server: grpc.aio.Server | None = None
        self.health_port: int | None = None
        self.reflection = env_str("CUTY_ENV", "development") == "development"
        self._service_names: list[str] = [health.SERVICE_NAME]
        self._background: list[BackgroundTask] = []
        self._tasks: list[asyncio.Task] = []
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self._db_ready: list[Callable[[], Awaitable[None]]] = []
        self._watch: DatabaseWatch | None = None
        self._watch_task: asyncio.Task | None = None

    def on_database_ready(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run `fn` once the database answers (and migrations are applied), before serving."""
        self._db_ready.append(fn)

    def watch_database(self, watch: DatabaseWatch) -> None:
        """Start NOT_SERVING and let `watch` decide: migrate and warm up with back-off, then follow
        the database (SERVING while it answers). Without a watch (tests in process), the database
        is taken as up at start."""
        watch.set_serving = self.set_serving
        watch.on_ready = self._db_ready
        self._watch = watch

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self._service_names:
            await self.health.set(name, status)
        await self.health.set("", status)

    def add_health_port(self, host: str, port: int) -> int:
        """Also serve gRPC health alone, in plaintext, on `port` (Kubernetes' gRPC probes and the
        test harness speak no TLS); nothing else is reachable there."""
        self.health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
        self.health_port = self.health_server.add_insecure_port(f"{host}:{port}")
        return self.health_port

    def add_service(self, service: ServiceDescriptor, callers: Callers, *, system: Iterable[str] = (),
                    roles: Iterable[str] = principal.USER_ROLES) -> None:
        """Serve `service` (its servicer already added to `self.server`) to the callers its table
        names, RPC by RPC; the table must name every RPC (fail closed). `system`: the RPCs where a
        caller other than the gateway acts as `system` (none unless named); `roles`: the user
        roles the gateway may bring (Trust)."""
        self.trust.add(service, callers, system=system, roles=roles)
        self._service_names.append(service.full_name)

    def add_background(self, fn: BackgroundTask) -> None:
        self._background.append(fn)

    def on_stop(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._on_stop.append(fn)

    async def start(self) -> int:
        if self.reflection:
            reflection.enable_server_reflection([*self._service_names, reflection.SERVICE_NAME], self.server)
        # Liveness is the process's own: it stays SERVING while the database is away.
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        if self._watch is None:
            for fn in self._db_ready:
                await fn()
            await self.set_serving(True)
        else:
            await self.set_serving(False)
            self._watch_task = asyncio.create_task(self._watch.run(), name=f"{self.name}:database-watch")
        await self.server.start()
        if self.health_server is not None:
            await self.health_server.start()
        for fn in self._background:
            self._tasks.append(asyncio.create_task(_supervised(fn), name=f"{self.name}:{getattr(fn, '__qualname__', fn)}"))
        log.info("gRPC server started", extra={"service": self.name, "port": self.port, "tls": self.transport.secure,
                                                "health_port": self.health_port, "reflection": self.reflection})
        return self.port

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        if self._watch_task is not None:
            self._watch_task.cancel()
        for t in self._tasks:
            t.cancel()
        if self._tasks:  # bounded: a worker that ignores its cancellation is named, not waited for forever
            _, pending = await asyncio.wait(self._tasks, timeout=BACKGROUND_STOP_SECONDS)
            if pending:
                log.error("background workers still running after stop", extra={
                    "service": self.name, "workers": [t.get_name() for t in pending]})
        await self.server.stop(self.grace_seconds)
        if self.health_server is not None:
            await self.health_server.stop(0)
        for fn in self._on_stop:
            await fn()
        log.info("gRPC server stopped", extra={"service": self.name})

    async def run_until_signal(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        waiter = asyncio.ensure_future(stop.wait())
        watched = [waiter] + ([self._watch_task] if self._watch_task is not None else [])
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        failed = self._watch_task is not None and self._watch_task.done() and not self._watch_task.cancelled() \
            and self._watch_task.exception() is not None
        waiter.cancel()
        await self.stop()
        if failed:  # a start-up check refused (not an unreachable database): exit, and say why
            raise SystemExit(f"{self.name}: {self._watch_task.exception()}")


async def _supervised(fn: BackgroundTask) -> None:
    """Run a background worker forever; a crash is logged and the worker restarted after a pause."""
    while True:
        try:
            await fn()
            return
        except asyncio.CancelledError:
            raise
        except UNREACHABLE as e:  # the database is away: the worker pauses and resumes, no traceback
            log.warning("background worker paused: database unreachable; retrying in 1 s",
                        extra={"worker": getattr(fn, "__qualname__", str(fn)), "error": type(e).__name__})
            await asyncio.sleep(1.0)
        except Exception:  # noqa: BLE001
            log.exception("background worker crashed; restarting in 1 s")
            await asyncio.sleep(1.0)
