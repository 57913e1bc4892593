"""Tests speak to services the way services do: mutual TLS with a certificate of the development
PKI, and users as assertions signed with the gateway's development key.

    md = user("alice", "customer")                          # cuty-user metadata, signed
    ch = acting_channel(addr, "booking", booking.grpc_api.CALLERS)
    await BookingServiceStub(ch).HoldSlot(req)              # sent as payments, which may hold
    await BookingServiceStub(ch).CreateSalon(req, metadata=user("a", "admin"))   # as the gateway

`acting_channel` sends each RPC with the certificate of a service its caller table allows: a call
that carries a user as the gateway (only the gateway brings users), one without as the
orchestrator first, so a test of booking's rules exercises the real table instead of bypassing
it. Tests of the table itself use `channel_as(identity)`.

Like the gateway, the harness signs a user for the one service a call goes to: `user(...)` gives
an assertion for no service, and the channels made here (`acting_channel`, `channel_as`) sign it
again, with the same key, for their target (`user(..., service=...)` signs for one directly).
Assertions made elsewhere (a forged one, another key) travel unchanged.
"""
from __future__ import annotations

import pathlib

import grpc

from ..config import env_str
from ..grpc_client import create_channel
from ..identity import ASSERTION_KEY, SIGNING_KEY_FILE, AssertionSigner
from ..principal import Principal
from ..tenancy import MERCHANT_ROLES
from ..tls import DEV_DIR, GATEWAY, PAYMENTS, DevPki, Transport, _write, issue

PREFERENCE = (PAYMENTS, GATEWAY, "codepool", "booking")
# The audience of `user(...)`'s assertions until a channel signs them for its target: no service's.
UNBOUND = "unbound"


def dev_pki(data_dir: str | pathlib.Path | None = None) -> DevPki:
    """The development PKI of `data_dir` (default: CUTY_DATA_DIR), created when missing."""
    folder = pathlib.Path(data_dir if data_dir is not None else env_str("CUTY_DATA_DIR", ".cuty")) / DEV_DIR
    return DevPki(folder).ensure()


_signers: dict[pathlib.Path, AssertionSigner] = {}
# Assertions made by `user`: token -> (the user, the PKI folder whose key signed it).
_minted: dict[str, tuple[Principal, pathlib.Path]] = {}


# The merchant of a test's staff and admins when the test does not name one (issue 14).
TEST_MERCHANT = "merchant-test"


def org_for(role: str, org: str | None = None) -> str:
    """The `org` of a test user: the one given, else TEST_MERCHANT for staff and admins."""
    return org if org is not None else (TEST_MERCHANT if role in MERCHANT_ROLES else "")


def _signer(folder: pathlib.Path) -> AssertionSigner:
    signer = _signers.get(folder)
    if signer is None:
        # A day long, so module-level metadata (ADMIN = user(...)) lasts the whole session.
        signer = _signers[folder] = AssertionSigner((folder / SIGNING_KEY_FILE).read_bytes(), ttl_seconds=86400)
    return signer


def user(subject: str, role: str, org: str | None = None, *, service: str = UNBOUND,
         pki: DevPki | None = None) -> tuple[tuple[str, str], ...]:
    """`cuty-user` metadata for this user, signed with the development gateway key, for `service`
    (default: none yet; the harness's channels sign it for their target). A staff or admin user
    belongs to `org` (TEST_MERCHANT unless given; "" for none)."""
    who = Principal(subject, role, org_for(role, org))
    folder = (pki or dev_pki()).folder
    md = _signer(folder).metadata(who, service)
    if service == UNBOUND:
        _minted[md[0][1]] = (who, folder)
    return md


def has_user(metadata) -> bool:
    return any(k == ASSERTION_KEY for k, _ in metadata or ())


def for_service(metadata, service: str):
    """`metadata` with the assertions `user` made for no service signed again for `service`, as the gateway signs
    a user for the service it calls; any other metadata unchanged."""
    if not has_user(metadata):
        return metadata
    out = []
    for k, v in metadata:
        minted = _minted.get(v) if k == ASSERTION_KEY else None
        out.append((k, _signer(minted[1]).token(minted[0], service)) if minted else (k, v))
    return tuple(out)


def transport_as(identity: str, pki: DevPki | None = None, *, secure: bool = True) -> Transport:
    """`identity`'s mutual TLS, or (`secure=False`, for servers run with CUTY_TLS=off) plaintext."""
    return Transport(identity, (pki or dev_pki()).files(identity)) if secure else Transport.plaintext(identity)


def trust_cas(pki: DevPki, *cas: DevPki) -> None:
    """A CA rotation's trust step: `pki`'s trust bundle (ca.crt) becomes the CAs of `cas`."""
    _write(pki.ca_path, b"".join(ca.ca_path.read_bytes() for ca in cas))


def reissue(pki: DevPki, identity: str, ca: DevPki, *, key_only: bool = False) -> bytes:
    """`identity`'s key and certificate in `pki`'s folder replaced by new ones from `ca`, the key
    first; with `key_only`, the certificate is not written but returned (a rotation caught half
    way: `write_cert` finishes it)."""
    key, cert = issue(ca.ca_key(), ca.ca_path.read_bytes(), identity)
    _write(pki.key_path(identity), key)
    if not key_only:
        _write(pki.cert_path(identity), cert)
    return cert


def write_cert(pki: DevPki, identity: str, cert: bytes) -> None:
    _write(pki.cert_path(identity), cert)


class _Signing:
    """A multicallable whose calls carry `user`'s assertions signed for `target` (for_service)."""

    def __init__(self, call, target: str):
        self._call, self._target = call, target

    def __call__(self, request, *args, metadata=None, **kwargs):
        return self._call(request, *args, metadata=for_service(metadata, self._target), **kwargs)


class SigningChannel:
    """A client channel (cutylib.grpc_client) whose calls carry users signed for its target."""

    def __init__(self, channel, target: str):
        self._channel, self._target = channel, target

    def unary_unary(self, *args, **kwargs):
        return _Signing(self._channel.unary_unary(*args, **kwargs), self._target)

    def unary_stream(self, *args, **kwargs):
        return _Signing(self._channel.unary_stream(*args, **kwargs), self._target)

    def stream_unary(self, *args, **kwargs):
        return _Signing(self._channel.stream_unary(*args, **kwargs), self._target)

    def stream_stream(self, *args, **kwargs):
        return _Signing(self._channel.stream_stream(*args, **kwargs), self._target)

    def __getattr__(self, name):
        return getattr(self._channel, name)

    async def __aenter__(self) -> "SigningChannel":
        return self

    async def __aexit__(self, *exc) -> None:
        await self._channel.close()


def channel_as(identity: str, addr: str, target: str, *, pki: DevPki | None = None,
               deadline_seconds: float = 20, secure: bool = True, options=None) -> SigningChannel:
    """A channel presenting `identity`'s certificate to the service `target`."""
    return SigningChannel(create_channel(addr, target, transport_as(identity, pki, secure=secure),
                                         deadline_seconds=deadline_seconds, options=options), target)


class ActingChannel:
    """A channel-like object that sends each RPC over a channel of an identity allowed to call it:
    a call carrying a user as the gateway, one without as the first of PREFERENCE its table allows."""

    def __init__(self, addr: str, target: str, callers: dict[str, set[str]], *, pki: DevPki | None = None,
                 deadline_seconds: float = 20, secure: bool = True):
        self._callers = callers
        self._secure = secure
        self._addr, self._target, self._pki, self._deadline = addr, target, pki, deadline_seconds
        self._channels: dict[str, SigningChannel] = {}

    def identity_for(self, method: str, with_user: bool = False) -> str:
        allowed = self._callers.get(method.rsplit("/", 1)[-1], set())
        if with_user:
            return GATEWAY
        return next((i for i in PREFERENCE if i in allowed and i != GATEWAY), GATEWAY if GATEWAY in allowed else PAYMENTS)

    def channel_for(self, method: str, with_user: bool = False) -> SigningChannel:
        identity = self.identity_for(method, with_user)
        ch = self._channels.get(identity)
        if ch is None:
            ch = self._channels[identity] = channel_as(identity, self._addr, self._target, pki=self._pki,
                                                       deadline_seconds=self._deadline, secure=self._secure)
        return ch

    def _lazy(self, kind: str, method: str, args, kwargs) -> "_Lazy":
        return _Lazy(lambda with_user: getattr(self.channel_for(method, with_user), kind)(method, *args, **kwargs))

    # Stubs build their callables when constructed (perhaps outside the event loop the calls run
    # in): the channel is chosen, and made, at the first call.
    def unary_unary(self, method, *args, **kwargs):
        return self._lazy("unary_unary", method, args, kwargs)

    def unary_stream(self, method, *args, **kwargs):
        return self._lazy("unary_stream", method, args, kwargs)

    def stream_unary(self, method, *args, **kwargs):
        return self._lazy("stream_unary", method, args, kwargs)

    def stream_stream(self, method, *args, **kwargs):
        return self._lazy("stream_stream", method, args, kwargs)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    async def __aenter__(self) -> "ActingChannel":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class _Lazy:
    """The multicallable of the channel chosen for a call: one with a user, one without."""

    def __init__(self, make):
        self._make = make
        self._callables: dict[bool, object] = {}

    def __call__(self, request, *args, metadata=None, **kwargs):
        with_user = has_user(metadata)
        call = self._callables.get(with_user)
        if call is None:
            call = self._callables[with_user] = self._make(with_user)
        return call(request, *args, metadata=metadata, **kwargs)


def acting_channel(addr: str, target: str, callers: dict[str, set[str]], **kw) -> ActingChannel:
    return ActingChannel(addr, target, callers, **kw)


def user_of(p: Principal, *, service: str = UNBOUND, pki: DevPki | None = None) -> tuple[tuple[str, str], ...]:
    return user(p.subject, p.role, p.org, service=service, pki=pki)
