"""The gateway's configuration: the shared variables (README.md, "Configuration") plus its own
`CUTY_GATEWAY_*` ones."""
from __future__ import annotations

from dataclasses import dataclass, field

from cutylib.config import SERVICES, Settings, env_field, env_float, env_int, env_str, grpc_addr_for
from cutylib.identity import AssertionSigner
from cutylib.tls import Transport


def backend_addr(owner: str) -> str:
    if owner in SERVICES:
        return grpc_addr_for(owner)
    return env_str(f"CUTY_{owner.upper()}_ADDR", "")


@dataclass(frozen=True)
class GatewaySettings:
    port: int = field(default_factory=lambda: Settings().http_port)
    host: str = env_field(env_str, "CUTY_HTTP_HOST", "0.0.0.0")
    jwt_secret: str = field(default_factory=lambda: Settings().jwt_secret)
    # Production: tokens of an identity provider, RS256/ES256, keys from its JWKS (HS256 then refused).
    jwks_url: str = env_field(env_str, "CUTY_JWT_JWKS_URL", "")
    jwt_issuer: str = env_field(env_str, "CUTY_JWT_ISSUER", "")
    jwt_audience: str = env_field(env_str, "CUTY_JWT_AUDIENCE", "")
    # The longest deadline of any call: a PayCheckout may wait on the PSP's synchronous answer
    # (docs/pspsim.md, pm_card_sync_timeout). Each route's own is policy.LOAD's, capped by this; a client
    # may ask for less with the Request-Timeout header.
    deadline_seconds: float = env_field(env_float, "CUTY_GATEWAY_DEADLINE_SECONDS", 15.0)
    max_body_bytes: int = env_field(env_int, "CUTY_GATEWAY_MAX_BODY_BYTES", 1024 * 1024)
    # Per caller (verified token subject); 0 disables. Generous: it guards against runaway clients only.
    rate_per_second: float = env_field(env_float, "CUTY_GATEWAY_RATE_PER_SECOND", 50.0)
    rate_burst: float = env_field(env_float, "CUTY_GATEWAY_RATE_BURST", 100.0)
    # Per client address, before any token is looked at (so random tokens get no fresh bursts),
    # on every route, public ones included; 0 disables. Generous: many users may share an address.
    address_rate_per_second: float = env_field(env_float, "CUTY_GATEWAY_ADDRESS_RATE_PER_SECOND", 100.0)
    address_rate_burst: float = env_field(env_float, "CUTY_GATEWAY_ADDRESS_RATE_BURST", 200.0)
    # Where the client's address comes from: empty = the socket peer; else a header that only a
    # trusted proxy in front of the gateway sets (X-Forwarded-For), and which hop of it: `last`
    # (the address the nearest proxy appended; the only safe one when the proxy appends) or `first`
    # (when the proxy replaces the header with the client's address).
    client_ip_header: str = env_field(env_str, "CUTY_GATEWAY_CLIENT_IP_HEADER", "")
    client_ip_hop: str = env_field(env_str, "CUTY_GATEWAY_CLIENT_IP_HOP", "last")
    # Admission control (admission.py): backend calls in flight, a limit within [min, max] (max 0:
    # off), starting at initial, that follows the throughput the services deliver. A service's
    # DEADLINE_EXCEEDED cuts it only past max(target, tolerance x the route's no-load latency).
    concurrency_min: int = env_field(env_int, "CUTY_GATEWAY_CONCURRENCY_MIN", 20)
    concurrency_max: int = env_field(env_int, "CUTY_GATEWAY_CONCURRENCY_MAX", 500)
    concurrency_initial: int = env_field(env_int, "CUTY_GATEWAY_CONCURRENCY_INITIAL", 20)
    latency_tolerance: float = env_field(env_float, "CUTY_GATEWAY_LATENCY_TOLERANCE", 2.0)
    latency_target_seconds: float = env_field(env_float, "CUTY_GATEWAY_LATENCY_TARGET_SECONDS", 0.1)
    # A request that finds its share of the limit in use waits for a freed place at most this long
    # (new work and reads; the target when the queue is standing; a purchase under way), and at
    # most queue_max wait at once; 0 seconds: refused at once.
    queue_seconds: float = env_field(env_float, "CUTY_GATEWAY_QUEUE_SECONDS", 0.01)
    queue_target_seconds: float = env_field(env_float, "CUTY_GATEWAY_QUEUE_TARGET_SECONDS", 0.005)
    critical_queue_seconds: float = env_field(env_float, "CUTY_GATEWAY_CRITICAL_QUEUE_SECONDS", 1.0)
    queue_max: int = env_field(env_int, "CUTY_GATEWAY_QUEUE_MAX", 200)
    health_timeout_seconds: float = env_field(env_float, "CUTY_GATEWAY_HEALTH_TIMEOUT_SECONDS", 1.0)
    # JWT clock skew tolerated between the issuer and this host (exp, iat, nbf).
    jwt_leeway_seconds: float = env_field(env_float, "CUTY_JWT_LEEWAY_SECONDS", 30.0)
    # Longer than a load balancer's idle timeout (often 60 s), so the balancer closes idle
    # connections first and never sends a request on a connection the gateway is closing.
    keepalive_seconds: float = env_field(env_float, "CUTY_GATEWAY_KEEPALIVE_SECONDS", 75.0)
    # Server-Sent Events (streaming routes): a comment line (`: keep-alive`) this often, so proxies
    # keep an idle stream open; and the longest a stream lives (the client reconnects with
    # Last-Event-ID and misses nothing).
    sse_heartbeat_seconds: float = env_field(env_float, "CUTY_SSE_HEARTBEAT_SECONDS", 15.0)
    sse_max_seconds: float = env_field(env_float, "CUTY_SSE_MAX_SECONDS", 3600.0)
    # owner -> address; empty means "from the environment" (CUTY_<SVC>_ADDR / _GRPC_PORT).
    backends: dict[str, str] = field(default_factory=dict)
    # Tests: the gateway's mutual-TLS identity and assertion signer (default: from the environment).
    transport: Transport | None = None
    signer: AssertionSigner | None = None
    # One JSON line per request on the gateway.access logger (access.py); the metric stays either way.
    access_log: bool = field(default_factory=lambda: env_str("CUTY_GATEWAY_ACCESS_LOG", "1") not in ("0", "false", "no"))

    def addr_for(self, owner: str) -> str:
        return self.backends.get(owner) or backend_addr(owner)
