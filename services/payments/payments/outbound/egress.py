"""Where a delivery may connect: merchant URLs must not reach inside the platform (server-side
request forgery; docs/security.md, "Webhook URLs cannot reach inside").

A webhook URL is a merchant admin's choice, and DNS is the merchant's too: a name that resolved to a
public address at registration may resolve to 127.0.0.1, 10.x or 169.254.169.254 (a cloud's metadata
service) at delivery. So the check is made when CONNECTING, on the addresses actually connected to:

- `GuardedResolver` resolves the name and refuses it when ANY of its addresses is not a public one
  (an answer mixing a public and a private address is a rebinding trick, not a fallback). aiohttp
  connects to exactly the addresses the resolver returned (no second lookup), so the address checked
  is the address used: it is pinned.
- `guarded_socket`, the connector's socket factory, checks the socket address once more just before
  `connect()`. That is what catches URLs with an IP literal (aiohttp does not ask the resolver for
  those) and, in production, any port but 443.

Refusals are `ForbiddenAddress` (an OSError, as aiohttp expects from a resolver or a socket), and the
delivery log records the coarse class `forbidden_address`, never the address or the socket's message.

`CUTY_WEBHOOK_ALLOW_PRIVATE=1` lets deliveries reach loopback and private addresses, on any port:
local receivers in development and tests. It is an explicit development setting; production refuses
to start with it (`Egress.from_env`).
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from cutylib.config import env_bool

ALLOW_PRIVATE = "CUTY_WEBHOOK_ALLOW_PRIVATE"
PRODUCTION_PORTS = frozenset({443})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Listed as well as asked of `ipaddress` (whose tables changed between patch releases): every range
# that is not a public unicast destination.
_REFUSED_V4 = tuple(ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
    "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4"))
_REFUSED_V6 = tuple(ipaddress.IPv6Network(n) for n in (
    "::/128", "::1/128", "::/96", "100::/64", "2001::/23", "2001:db8::/32", "fc00::/7", "fe80::/10", "fec0::/10",
    "ff00::/8"))
# IPv6 ranges that carry an IPv4 address: judged by that address.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
# Names that mean this machine whatever DNS says (RFC 6761), with or without the final dot.
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


class ForbiddenAddress(OSError):
    """A delivery refused before connecting: the address (or port) is not one a merchant may reach."""


def embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for: IPv4-mapped (::ffff:a.b.c.d), NAT64, 6to4."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _SIX_TO_FOUR:
        return ip.sixtofour
    return None


def refusal(ip: IPAddress) -> str | None:
    """Why `ip` is not a destination for a merchant's webhook, or None when it is a public one."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_v4(ip)
        if inner is not None:
            why = refusal(inner)
            return f"embeds {why}" if why else None
        if ip.scope_id:
            return "scoped (link-local)"
    for what in ("unspecified", "loopback", "private", "link_local", "multicast", "reserved", "site_local"):
        if getattr(ip, f"is_{what}", False):
            return what
    networks = _REFUSED_V4 if ip.version == 4 else _REFUSED_V6
    if any(ip in n for n in networks):
        return "special-purpose"
    if not ip.is_global:  # e.g. 100.64.0.0/10, the carrier-grade NAT space
        return "not global"
    return None


def refused_name(host: str) -> bool:
    """A name that means this machine, whatever the resolver answers (`localhost.`, `x.localhost`)."""
    name = host.lower().rstrip(".")
    return name in _LOCAL_NAMES or name.endswith(".localhost")


def parse_ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Egress:
    """What deliveries may connect to. `ports` None: any port."""
    allow_private: bool = False
    ports: frozenset[int] | None = None

    @classmethod
    def from_env(cls, environment: str, allow_private: bool | None = None) -> "Egress":
        """Production: public addresses, port 443, and CUTY_WEBHOOK_ALLOW_PRIVATE refused outright.
        Elsewhere: public addresses on any port, private ones only with CUTY_WEBHOOK_ALLOW_PRIVATE=1
        (`allow_private`, when given, instead of the variable)."""
        allow = env_bool(ALLOW_PRIVATE, False) if allow_private is None else allow_private
        if environment == "production":
            if allow:
                raise SystemExit(f"refusing to start with CUTY_ENV=production: {ALLOW_PRIVATE} must be unset "
                                 "(merchant webhooks may only reach public addresses)")
            return cls(allow_private=False, ports=PRODUCTION_PORTS)
        return cls(allow_private=allow, ports=None)

    def check_address(self, ip: IPAddress, port: int) -> None:
        if self.ports is not None and port not in self.ports:
            raise ForbiddenAddress("port not allowed")
        if not self.allow_private:
            why = refusal(ip)
            if why is not None:
                raise ForbiddenAddress(f"address not public ({why})")

    def check_name(self, host: str) -> None:
        if not self.allow_private and refused_name(host):
            raise ForbiddenAddress("local name")


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, refusing a name any of whose addresses is not allowed (the answer
    returned is what the connector connects to: the checked addresses, pinned)."""

    def __init__(self, egress: Egress, inner: AbstractResolver | None = None):
        self.egress = egress
        self.inner = inner or DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET):
        self.egress.check_name(host)
        answers = await self.inner.resolve(host, port, family)
        for a in answers:
            ip = parse_ip(a["host"])
            if ip is None:
                raise ForbiddenAddress("unparsable address")
            self.egress.check_address(ip, a["port"])
        return answers

    async def close(self) -> None:
        await self.inner.close()


def guarded_socket(egress: Egress):
    """The connector's socket factory: the last check, on the exact address about to be connected."""
    def create(addr_info) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        ip = parse_ip(str(sockaddr[0]))
        if ip is None:
            raise ForbiddenAddress("unparsable address")
        egress.check_address(ip, int(sockaddr[1]))
        sock = socket.socket(family=family, type=type_, proto=proto)
        sock.setblocking(False)
        return sock
    return create


def connector(egress: Egress, *, limit: int, resolver: AbstractResolver | None = None) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(limit=limit, resolver=GuardedResolver(egress, resolver),
                                socket_factory=guarded_socket(egress))


def _caused_by_refusal(exc: BaseException | None) -> bool:
    """Whether a ForbiddenAddress is behind `exc` (aiohttp wraps what a resolver or socket raised)."""
    for _ in range(8):
        if exc is None:
            return False
        if isinstance(exc, ForbiddenAddress):
            return True
        exc = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc.__cause__
    return False


def error_class(exc: BaseException) -> str:
    """The coarse class an admin reads in the delivery log: never a socket's own message (which
    could tell a merchant what answers inside the network)."""
    if _caused_by_refusal(exc):
        return "forbidden_address"
    e = exc
    if isinstance(e, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return "timeout"
    if isinstance(e, aiohttp.ClientConnectorDNSError):
        return "dns"
    if isinstance(e, (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError, ssl.SSLError)):
        return "tls"
    if isinstance(e, aiohttp.ClientConnectorError):
        os_error = e.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return "connection_refused"
        if isinstance(os_error, socket.gaierror):
            return "dns"
        if isinstance(os_error, (TimeoutError, asyncio.TimeoutError)):
            return "timeout"
        return "connection_failed"
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError)):
        return "connection_lost"
    if isinstance(e, aiohttp.ClientResponseError):
        return "bad_response"
    if isinstance(e, aiohttp.InvalidURL):
        return "bad_url"
    return "error"
