"""Bearer JWTs (HS256, `CUTY_JWT_SECRET`) -> the principal sent to the services as metadata."""
from __future__ import annotations

import time

import jwt

from cutylib.principal import Principal

from .policy import TOKEN_ROLES
from .problems import Problem


def unauthenticated(detail: str) -> Problem:
    # RFC 6750: tell the client which scheme and why, so it knows to get a new token.
    return Problem(401, "unauthenticated", detail,
                   headers={"www-authenticate": 'Bearer realm="cuty", error="invalid_token"'})


class Verifier:
    """`verify` with a cache of tokens already verified, until their `exp`.

    Clients send the same token on every request; checking its HMAC and decoding its JSON each
    time was a measurable share of the gateway's CPU. A cached token is still refused once
    expired. The cache is bounded (cleared when full: entries are cheap to rebuild).
    """

    def __init__(self, secret: str, *, leeway: float = 0, max_entries: int = 50_000, clock=time.time):
        self.secret = secret
        self.leeway = leeway
        self.max_entries = max_entries
        self._clock = clock
        self._cache: dict[str, tuple[Principal, float]] = {}

    def __call__(self, authorization: str | None) -> Principal:
        hit = self._cache.get(authorization) if authorization else None
        if hit is not None:
            if self._clock() < hit[1] + self.leeway:
                return hit[0]
            del self._cache[authorization]
        who, exp = _verify(authorization, self.secret, self.leeway)
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache[authorization] = (who, exp)
        return who


def verify(authorization: str | None, secret: str, *, leeway: float = 0) -> Principal:
    """The principal of an `Authorization: Bearer <JWT>` header, or a 401 Problem."""
    return _verify(authorization, secret, leeway)[0]


def _verify(authorization: str | None, secret: str, leeway: float) -> tuple[Principal, float]:
    if not authorization:
        raise unauthenticated("an Authorization: Bearer <token> header is required")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthenticated(f"expected 'Bearer <token>', got a {scheme!r} credential")
    try:
        claims = jwt.decode(token.strip(), secret, algorithms=["HS256"], leeway=leeway,
                            options={"require": ["exp", "sub"]})
    except jwt.ExpiredSignatureError:
        raise unauthenticated("the token has expired") from None
    except jwt.InvalidSignatureError:
        raise unauthenticated("the token's signature is not valid") from None
    except jwt.MissingRequiredClaimError as e:
        raise unauthenticated(f"the token lacks the {e.claim!r} claim") from None
    except jwt.InvalidTokenError as e:
        raise unauthenticated(f"the token is not valid: {e}") from None
    sub, role = claims.get("sub"), claims.get("role")
    if not isinstance(sub, str) or not sub.strip():
        raise unauthenticated("the token's 'sub' claim must be a non-empty string")
    if role not in TOKEN_ROLES:
        raise unauthenticated(f"the token's 'role' must be one of {', '.join(sorted(TOKEN_ROLES))}, got {role!r}")
    exp = claims["exp"]
    if not isinstance(exp, (int, float)):
        raise unauthenticated("the token's 'exp' claim must be a number")
    return Principal(subject=sub, role=role), float(exp)


def issue(secret: str, subject: str, role: str, *, ttl_seconds: float = 3600, now: float | None = None) -> str:
    """A token for dev tooling and tests (`make run` prints one per role)."""
    now = time.time() if now is None else now
    return jwt.encode({"sub": subject, "role": role, "iat": int(now), "exp": int(now + ttl_seconds)},
                      secret, algorithm="HS256")
