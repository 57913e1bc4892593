"""Bearer tokens of the identity provider -> the user (Principal): one verifier for the gateway
(a client's `Authorization` header) and for every service (an internal client that forwards its
user's token, cutylib.clients).

Two kinds of token key, never mixed:
- development: HS256 with `CUTY_JWT_SECRET`;
- production: RS256/ES256 from an identity provider's JWKS (`CUTY_JWT_JWKS_URL`, PyJWT's
  `PyJWKClient` with caching). With a JWKS configured, HS256 is refused, so a token signed with the
  provider's public key as an HMAC secret (algorithm confusion) is never accepted.
`iss` / `aud` are checked when `CUTY_JWT_ISSUER` / `CUTY_JWT_AUDIENCE` are set; exp/iat/nbf allow
`CUTY_JWT_LEEWAY_SECONDS` of clock skew. A bad token is `errors.Unauthenticated` naming why (the
gateway turns it into its 401 problem).

Verified tokens are cached by the token itself, bounded by count and by bytes.
"""
from __future__ import annotations

import asyncio
import time

import jwt

from .access import TOKEN_ROLES
from .config import env_float, env_str
from .errors import Unauthenticated
from .principal import Principal
from .tenancy import MERCHANT_ROLES, merchant_id_problem

MAX_TOKEN_BYTES = 8192
ASYMMETRIC = ["RS256", "ES256"]
BEARER_KEY = "authorization"  # gRPC metadata of a forwarded token: `authorization: Bearer <token>`


class TokenVerifier:
    """`await verifier(token)` -> Principal, with a cache of tokens already verified until their `exp`.

    Clients send the same token on every request; checking its signature and decoding its JSON
    each time was a measurable share of the gateway's CPU. A cached token is still refused once
    expired. The cache is bounded by entries and by bytes (cleared when full: entries are cheap
    to rebuild).
    """

    def __init__(self, secret: str = "", *, jwks_url: str = "", issuer: str = "", audience: str = "",
                 leeway: float = 30, max_entries: int = 50_000, max_bytes: int = 16 * 1024 * 1024,
                 clock=time.time, jwks_client=None):
        if not secret and not jwks_url and jwks_client is None:
            raise ValueError("a JWT secret (development) or a JWKS URL is needed")
        self.secret = secret
        self.issuer = issuer
        self.audience = audience
        self.leeway = leeway
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._jwks = jwks_client or (jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=300, timeout=5)
                                     if jwks_url else None)
        self._cache: dict[str, tuple[Principal, float]] = {}
        self._bytes = 0
        self.verified = 0  # tokens checked cryptographically (cache misses)

    @classmethod
    def from_env(cls) -> "TokenVerifier":
        """The identity provider the gateway trusts, from the same variables (docs/security.md,
        "Settings"): a JWKS URL with its issuer and audience, else the development HS256 secret."""
        from .config import Settings

        jwks_url = env_str("CUTY_JWT_JWKS_URL", "")
        return cls("" if jwks_url else Settings().jwt_secret, jwks_url=jwks_url,
                   issuer=env_str("CUTY_JWT_ISSUER", ""), audience=env_str("CUTY_JWT_AUDIENCE", ""),
                   leeway=env_float("CUTY_JWT_LEEWAY_SECONDS", 30.0))

    async def __call__(self, token: str) -> Principal:
        hit = self._cache.get(token)
        if hit is not None:
            if self._clock() < hit[1] + self.leeway:
                return hit[0]
            del self._cache[token]
            self._bytes -= len(token)
        if len(token) > MAX_TOKEN_BYTES:
            raise Unauthenticated(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
        key = self.secret
        algorithms = ["HS256"]
        if self._jwks is not None:
            algorithms = ASYMMETRIC
            try:
                # A network fetch when the key id is new (cached otherwise): off the event loop.
                key = (await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)).key
            except jwt.PyJWKClientError as e:
                raise Unauthenticated(f"the token's signing key is unknown: {e}") from None
            except jwt.InvalidTokenError:
                raise Unauthenticated("the token is not a JWT") from None
        who, exp = self.verify(token, key, algorithms)
        if len(self._cache) >= self.max_entries or self._bytes + len(token) > self.max_bytes:
            self._cache.clear()
            self._bytes = 0
        self._cache[token] = (who, exp)
        self._bytes += len(token)
        return who

    def seconds_left(self, token: str) -> float:
        """How long a token this verifier has verified is still accepted: until its `exp` plus the
        leeway. A live stream opened with the token ends then (docs/security.md)."""
        hit = self._cache.get(token)
        # (Not cached: verified a moment ago and the cache cleared since; its `exp` as it says.)
        exp = hit[1] if hit is not None else float(jwt.decode(token, options={"verify_signature": False})["exp"])
        return exp + self.leeway - self._clock()

    def verify(self, token: str, key, algorithms: list[str]) -> tuple[Principal, float]:
        self.verified += 1
        options = {"require": ["exp", "sub"], "verify_aud": bool(self.audience), "verify_iss": bool(self.issuer)}
        try:
            claims = jwt.decode(token, key, algorithms=algorithms, leeway=self.leeway, options=options,
                                audience=self.audience or None, issuer=self.issuer or None)
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("the token is not valid yet") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("the token's signature is not valid") from None
        except jwt.MissingRequiredClaimError as e:
            raise Unauthenticated(f"the token lacks the {e.claim!r} claim") from None
        except (jwt.InvalidIssuerError, jwt.InvalidAudienceError) as e:
            raise Unauthenticated(f"the token was not issued for this service: {e}") from None
        except jwt.InvalidAlgorithmError:
            raise Unauthenticated(f"the token must be signed with {' or '.join(algorithms)}") from None
        except jwt.InvalidTokenError as e:
            raise Unauthenticated(f"the token is not valid: {e}") from None
        return principal_of(claims), float(claims["exp"])


def principal_of(claims: dict) -> Principal:
    sub, role, org = claims.get("sub"), claims.get("role"), claims.get("org")
    if not isinstance(sub, str) or not sub.strip():
        raise Unauthenticated("the token's 'sub' claim must be a non-empty string")
    if role not in TOKEN_ROLES:
        raise Unauthenticated(f"the token's 'role' must be one of {', '.join(sorted(TOKEN_ROLES))}, got {role!r}")
    problem = None if org is None else merchant_id_problem(org)
    if problem is not None:
        raise Unauthenticated(f"the token's 'org' claim {problem}")
    if role in MERCHANT_ROLES and org is None:
        # Staff and admins act for one merchant, named by the identity provider.
        raise Unauthenticated(f"a token with role {role!r} must carry the 'org' claim (the merchant it belongs to)")
    if not isinstance(claims["exp"], (int, float)):
        raise Unauthenticated("the token's 'exp' claim must be a number")
    # Customers and operators belong to no merchant: an `org` on their tokens means nothing here.
    return Principal(subject=sub, role=role, org=org if role in MERCHANT_ROLES else "")


def bearer_of(value: str) -> str:
    """The token of a `Bearer <token>` credential (an HTTP header or gRPC metadata), or
    Unauthenticated naming what is wrong."""
    if not value:
        raise Unauthenticated("an Authorization: Bearer <token> credential is required")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated(f"expected 'Bearer <token>', got a {scheme[:20]!r} credential")
    if len(token) > MAX_TOKEN_BYTES:
        raise Unauthenticated(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
    return token


def issue(secret: str, subject: str, role: str, *, ttl_seconds: float = 3600, now: float | None = None,
          org: str | None = None) -> str:
    """An HS256 token for dev tooling and tests (`make run` prints one per role)."""
    now = time.time() if now is None else now
    claims = {"sub": subject, "role": role, "iat": int(now), "exp": int(now + ttl_seconds)}
    if org:
        claims["org"] = org
    return jwt.encode(claims, secret, algorithm="HS256")
