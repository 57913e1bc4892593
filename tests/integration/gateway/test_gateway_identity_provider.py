"""Tokens from a real identity provider: RS256/ES256 keys from a JWKS endpoint (served by the test),
issuer and audience checked, algorithm confusion refused; rate limiting before any verification."""
import asyncio
import json
import time

import httpx
import jwt
import pytest
import pytest_asyncio
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from cutylib.pgcluster import free_port

SLOTS = "/v1/salons/00000000-0000-4000-8000-000000000003/slots?startTime=2026-03-08T00:00:00Z&endTime=2026-03-09T00:00:00Z"
ISSUER, AUDIENCE = "https://id.test/", "cuty-checkout"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def jwk(key, kid: str, alg: str) -> dict:
    d = json.loads(jwt.algorithms.get_default_algorithms()[alg].to_jwk(key.public_key()))
    return {**d, "kid": kid, "alg": alg, "use": "sig"}


@pytest_asyncio.fixture(scope="module")
async def jwks():
    """A JWKS endpoint as an identity provider publishes it; counts how often it is fetched."""
    fetched = []

    async def keys(request):
        fetched.append(time.time())
        return JSONResponse({"keys": [jwk(RSA_KEY, "rsa-1", "RS256"), jwk(EC_KEY, "ec-1", "ES256")]})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/jwks.json", keys)]), host="127.0.0.1",
                                           port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}/jwks.json", fetched
    server.should_exit = True
    await task


def token(key, kid: str, alg: str, **claims) -> str:
    body = {"sub": "idp-user", "role": "customer", "iss": ISSUER, "aud": AUDIENCE, "iat": int(time.time()),
            "exp": int(time.time()) + 300, **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm=alg, headers={"kid": kid})


@pytest_asyncio.fixture(scope="module")
async def idp_gateway(start_gateway, jwks):
    url, _ = jwks
    return await start_gateway(jwks_url=url, jwt_issuer=ISSUER, jwt_audience=AUDIENCE,
                               rate_per_second=1000, rate_burst=1000)


async def get(g, tok: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=g.url) as c:
        return await c.get(SLOTS, headers={"Authorization": f"Bearer {tok}"})


async def test_tokens_signed_by_the_providers_keys_are_accepted(idp_gateway, fake, jwks):
    for key, kid, alg in ((RSA_KEY, "rsa-1", "RS256"), (EC_KEY, "ec-1", "ES256")):
        r = await get(idp_gateway, token(key, kid, alg, sub=f"user-{alg}"))
        assert r.status_code == 200, r.text
        assert fake.last("ListSlots").who.subject == f"user-{alg}"
    fetched = len(jwks[1])
    await get(idp_gateway, token(RSA_KEY, "rsa-1", "RS256", sub="another"))
    assert len(jwks[1]) == fetched  # keys are cached, not fetched per token


@pytest.mark.parametrize("claims, why", [
    ({"iss": "https://evil.test/"}, "issued"), ({"aud": "another-app"}, "issued"), ({"aud": None}, "aud"),
    ({"exp": -120}, "expired"), ({"nbf": 120}, "not valid yet"),  # seconds from now, beyond the leeway
])
async def test_wrong_issuer_audience_or_time_is_401(idp_gateway, claims, why):
    now = int(time.time())
    claims = {k: (now + v if k in ("exp", "nbf") else v) for k, v in claims.items()}
    r = await get(idp_gateway, token(RSA_KEY, "rsa-1", "RS256", **claims))
    assert r.status_code == 401 and why in r.json()["detail"], r.text


async def test_clock_skew_within_the_leeway_is_tolerated(idp_gateway):
    r = await get(idp_gateway, token(RSA_KEY, "rsa-1", "RS256", exp=int(time.time()) - 10, nbf=int(time.time()) + 10))
    assert r.status_code == 200, r.text


async def test_algorithm_confusion_and_unknown_keys_are_401(idp_gateway):
    public_pem = RSA_KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    # An HS256 token whose HMAC secret is the provider's public key: anyone can make one.
    header = jwt.utils.base64url_encode(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode())
    payload = jwt.utils.base64url_encode(json.dumps({"sub": "root", "role": "admin", "iss": ISSUER, "aud": AUDIENCE,
                                                     "exp": int(time.time()) + 300}).encode())
    import hashlib
    import hmac
    signing_input = header + b"." + payload
    forged = (signing_input + b"." + jwt.utils.base64url_encode(
        hmac.new(public_pem, signing_input, hashlib.sha256).digest())).decode()
    assert (await get(idp_gateway, forged)).status_code == 401
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert (await get(idp_gateway, token(other, "rsa-1", "RS256"))).status_code == 401  # wrong key, known kid
    assert (await get(idp_gateway, token(other, "rsa-9", "RS256"))).status_code == 401  # unknown kid
    assert (await get(idp_gateway, "not-a-jwt")).status_code == 401


async def test_rate_limited_requests_verify_no_token(start_gateway, bearer):
    g = await start_gateway(rate_per_second=0.001, rate_burst=2)
    headers = bearer("customer", sub="flood")
    async with httpx.AsyncClient(base_url=g.url) as c:
        codes = [(await c.get(SLOTS, headers=headers)).status_code for _ in range(50)]
    assert codes[:2] == [200, 200] and set(codes[2:]) == {429}
    assert g.app.verify.verified == 1  # the first; the second came from the cache; 48 refused unverified
