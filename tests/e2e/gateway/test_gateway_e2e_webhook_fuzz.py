"""No webhook input makes the platform answer 5xx or leak a traceback.

Property test over the real gateway and payments (the session's devstack): any Cuty-Signature
header (missing, garbage, non-ASCII, a t= of thousands of digits, many parts) with any body (bytes,
broken or deeply nested JSON, huge numbers), signed with the right secret or not, is answered 200,
400 or 401 (413 when too large), as a problem document without a traceback, and the services log
no traceback for it."""
import hashlib
import hmac
import json
import time

from hypothesis import HealthCheck, example, given, settings, strategies as st

# Header values as bytes an HTTP/1.1 client may send: visible ASCII, obs-text (0x80-0xff), spaces.
_HEADER_BYTES = st.binary(max_size=300).map(
    lambda b: bytes(c for c in b if c == 0x20 or 0x21 <= c <= 0x7e or c >= 0x80).strip())
_DIGITS = st.integers(min_value=1, max_value=6000).map(lambda n: b"9" * n)
_HEX = st.binary(min_size=0, max_size=40).map(lambda b: b.hex().encode())
_SIGNATURE_LIKE = st.builds(
    lambda t, v, extra: b"t=" + t + b",v1=" + v + extra,
    st.one_of(_DIGITS, st.sampled_from([b"", b"-1", b"0x10", b"1e9", b"\xd9\xa3", b"\xef\xbc\x91", b" 1"])),
    _HEX, st.sampled_from([b"", b",", b",v1=", b",t=1", b",v0=zz", b"," * 500, b",v1=" + b"a" * 64]))

_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
_JSON = st.recursive(_JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=20)
_EVENTISH = st.builds(lambda id_, type_, obj: json.dumps({"id": id_, "type": type_, "data": {"object": obj}}).encode(),
                      _JSON, _JSON, _JSON)
_BODIES = st.one_of(
    st.binary(max_size=400),
    _JSON.map(lambda v: json.dumps(v).encode()),
    _EVENTISH,
    st.integers(min_value=1, max_value=50_000).map(lambda n: b"[" * n + b"]" * n),     # deep nesting
    st.integers(min_value=4_000, max_value=20_000).map(lambda n: b'{"id": ' + b"7" * n + b"}"),  # huge int
)


def _signed(secret: str, body: bytes) -> bytes:
    t = int(time.time())
    return f"t={t},v1=".encode() + hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest().encode()


# The inputs review found, always tried first: a 4,300-digit timestamp (int() refuses it), NUL and a
# lone surrogate in a signed event (Postgres text refuses them), 1e999 (inf; jsonb refuses it),
# nesting deeper than the JSON parser's recursion, an obs-text byte in the header (not metadata).
@example(header=b"t=" + b"1" * 4300 + b",v1=" + b"0" * 64, body=b"{}")
@example(header=b"SIGNED", body=b'{"id": "evt_\\u0000", "type": "payment_intent.succeeded", "data": {"object": {"id": "pi"}}}')
@example(header=b"SIGNED", body=b'{"id": "evt_\\ud800", "type": "t", "data": {"object": {"id": "pi_\\ud800"}}}')
@example(header=b"SIGNED", body=b'{"id": "evt_inf", "type": "t", "data": {"object": {"id": "pi", "amount": 1e999}}}')
@example(header=b"SIGNED", body=b"[" * 5000 + b"]" * 5000)
@example(header=b"t=1\x80,v1=00", body=b"{}")
@example(header=b"SIGNED", body=b'{"id": ' + b"7" * 4000 + b"}")  # echoed whole, it overflowed gRPC metadata
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(header=st.one_of(st.none(), _HEADER_BYTES, _SIGNATURE_LIKE, st.just(b"SIGNED")), body=_BODIES)
async def test_webhook_never_answers_5xx_nor_a_traceback(http, stack, header, body):
    log = stack.data_dir / "devstack.out"
    before = log.stat().st_size
    if header == b"SIGNED":  # a good signature: the body itself is what gets parsed
        header = _signed(stack.env["CUTY_PSP_WEBHOOK_SECRET"], body)
    headers = {} if header is None else {"Cuty-Signature": header}
    r = await http.post("/v1/psp/webhooks", content=body, headers=headers)
    assert r.status_code in (200, 400, 401, 413), (r.status_code, r.text[:500])
    assert "Traceback" not in r.text
    if r.status_code != 200:
        assert r.headers["content-type"] == "application/problem+json"
    with open(log, "rb") as f:
        f.seek(before)
        assert b"Traceback" not in f.read()
