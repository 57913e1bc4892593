"""The end user travels between services as a signed assertion, never as plain metadata.

The gateway verifies the client's token, then forwards the user as a short-lived JWT signed ES256
with a key only the gateway holds (`CUTY_USER_ASSERTION_KEY`); services verify it with the public
key(s) (`CUTY_USER_ASSERTION_PUBLIC_KEYS`, comma separated: several during rotation). Metadata
`cuty-user`. In development both default to a key pair in the development PKI folder.

Each assertion names the one service it is for (`aud` = `cuty-<service>`, `audience_for`): the
gateway signs one per target, and a service refuses another's, so an assertion a service received
cannot be replayed by that service against a third one.

Signing and verifying are cached: the gateway signs once per user per half-lifetime, a service
verifies each distinct assertion once, so the cost per call is a dictionary lookup.
"""
from __future__ import annotations

import os
import pathlib
import time

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

from .config import env_str
from .errors import Unauthenticated
from .principal import Principal
from .tenancy import merchant_id_problem

ASSERTION_KEY = "cuty-user"
ISSUER = "cuty-gateway"
AUDIENCE_PREFIX = "cuty-"
SIGNING_KEY_FILE = "user-assertion.key"
PUBLIC_KEY_FILE = "user-assertion.pub"
MAX_ASSERTION_BYTES = 4096


def audience_for(service: str) -> str:
    """The audience of assertions for `service` (its certificate identity: booking, codepool, payments)."""
    return AUDIENCE_PREFIX + service


def _dev_folder() -> pathlib.Path:
    from .tls import DevPki

    return DevPki.default().folder


def _production() -> bool:
    return env_str("CUTY_ENV", "development") == "production"


class AssertionSigner:
    """Signs `Principal`s into `cuty-user` metadata (the gateway's side)."""

    def __init__(self, private_key_pem: bytes, *, ttl_seconds: float = 120, clock=time.time,
                 max_entries: int = 100_000):
        # Parsed once: PyJWT given PEM bytes parses them again on every signature (a new buyer each).
        self._key = load_pem_private_key(private_key_pem, password=None)
        self.ttl = ttl_seconds
        self._clock = clock
        self.max_entries = max_entries
        self._cache: dict[tuple[str, str, str, str], tuple[str, float]] = {}

    @classmethod
    def from_env(cls) -> "AssertionSigner":
        path = env_str("CUTY_USER_ASSERTION_KEY", "")
        if not path:
            if _production():
                raise SystemExit("refusing to start with CUTY_ENV=production without CUTY_USER_ASSERTION_KEY "
                                 "(the gateway's key for signing user assertions)")
            path = str(_dev_folder() / SIGNING_KEY_FILE)
        return cls(pathlib.Path(path).read_bytes())

    def token(self, who: Principal, service: str) -> str:
        """`who` as an assertion for `service` alone."""
        key = (who.subject, who.role, who.org, service)
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and now < hit[1]:
            return hit[0]
        claims = {"iss": ISSUER, "aud": audience_for(service), "sub": who.subject, "role": who.role,
                  "iat": int(now), "exp": int(now + self.ttl)}
        if who.org:
            claims["org"] = who.org
        token = jwt.encode(claims, self._key, algorithm="ES256")
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        # Reused for half its life, so a forwarded assertion always has time left to be checked.
        self._cache[key] = (token, now + self.ttl / 2)
        return token

    def metadata(self, who: Principal, service: str) -> tuple[tuple[str, str], ...]:
        return ((ASSERTION_KEY, self.token(who, service)),)


class AssertionVerifier:
    """Verifies `cuty-user` assertions for `service` (every service's side); a bad one, or one for
    another service, is UNAUTHENTICATED."""

    def __init__(self, public_keys_pem: list[bytes], service: str, *, leeway: float = 5, clock=time.time,
                 max_entries: int = 100_000):
        if not public_keys_pem:
            raise ValueError("at least one public key is needed")
        self.service = service
        self.audience = audience_for(service)
        # Parsed once: PyJWT given PEM bytes parses them again on every verification.
        self._keys = [load_pem_public_key(pem) for pem in public_keys_pem]
        self.leeway = leeway
        self._clock = clock
        self.max_entries = max_entries
        self._cache: dict[str, tuple[Principal, float]] = {}

    @classmethod
    def from_env(cls, service: str) -> "AssertionVerifier":
        paths = env_str("CUTY_USER_ASSERTION_PUBLIC_KEYS", "")
        if not paths:
            if _production():
                raise SystemExit("refusing to start with CUTY_ENV=production without "
                                 "CUTY_USER_ASSERTION_PUBLIC_KEYS (the gateway's public key)")
            paths = str(_dev_folder() / PUBLIC_KEY_FILE)
        return cls([pathlib.Path(p.strip()).read_bytes() for p in paths.split(",") if p.strip()], service)

    def verify(self, token: str) -> Principal:
        hit = self._cache.get(token)
        now = self._clock()
        if hit is not None:
            if now < hit[1] + self.leeway:
                return hit[0]
            del self._cache[token]
        if len(token) > MAX_ASSERTION_BYTES:
            raise Unauthenticated("the user assertion is too large")
        claims = None
        for key in self._keys:
            try:
                claims = jwt.decode(token, key, algorithms=["ES256"], audience=self.audience, issuer=ISSUER,
                                    leeway=self.leeway, options={"require": ["exp", "iat", "sub", "role"]})
                break
            except jwt.InvalidSignatureError:
                continue
            except jwt.InvalidAudienceError:
                raise Unauthenticated(f"the user assertion is not for {self.service}") from None
            except jwt.InvalidTokenError:
                raise Unauthenticated("the user assertion is not valid") from None
        if claims is None:
            raise Unauthenticated("the user assertion's signature is not valid")
        if claims.get("aud") != self.audience:  # one service only: a list naming several is refused too
            raise Unauthenticated(f"the user assertion is not for {self.service} alone")
        sub, role, org = claims.get("sub"), claims.get("role"), claims.get("org", "")
        if not isinstance(sub, str) or not sub or not isinstance(role, str) or not isinstance(org, str):
            raise Unauthenticated("the user assertion's claims are malformed")
        if org and merchant_id_problem(org) is not None:  # '*' would mean every merchant: never a claim
            raise Unauthenticated("the user assertion's 'org' claim is not a merchant id")
        who = Principal(subject=sub, role=role, org=org)
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache[token] = (who, float(claims["exp"]))
        return who


def ensure_dev_signing_key(folder: pathlib.Path) -> None:
    """The development key pair for user assertions (called by DevPki.ensure under its lock)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    priv, pub = folder / SIGNING_KEY_FILE, folder / PUBLIC_KEY_FILE
    if priv.exists() and pub.exists():
        return
    key = ec.generate_private_key(ec.SECP256R1())
    fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
