"""Bearer JWTs -> the user the gateway forwards (signed) to the services.

The verification itself is cutylib.tokens (the services verify an internal client's forwarded
token with the same code and settings); here its refusals become the gateway's 401 problem.

The header is parsed first (`token_of`, no cryptography), so the rate limiter can refuse a request
before any token is verified.
"""
from __future__ import annotations

from cutylib import tokens
from cutylib.errors import Unauthenticated
from cutylib.principal import Principal
from cutylib.tokens import ASYMMETRIC, MAX_TOKEN_BYTES, issue  # noqa: F401 - dev tooling and tests use them here

from .problems import Problem


def unauthenticated(detail: str) -> Problem:
    # RFC 6750: tell the client which scheme and why, so it knows to get a new token.
    return Problem(401, "unauthenticated", detail,
                   headers={"www-authenticate": 'Bearer realm="cuty", error="invalid_token"'})


def token_of(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header, or a 401 Problem."""
    try:
        return tokens.bearer_of(authorization or "")
    except Unauthenticated as e:
        raise unauthenticated(e.message) from None


class Verifier(tokens.TokenVerifier):
    """cutylib.tokens.TokenVerifier answering a refusal as the gateway's 401 problem."""

    async def __call__(self, token: str) -> Principal:
        try:
            return await super().__call__(token)
        except Unauthenticated as e:
            raise unauthenticated(e.message) from None


def principal_of(claims: dict) -> Principal:
    try:
        return tokens.principal_of(claims)
    except Unauthenticated as e:
        raise unauthenticated(e.message) from None
