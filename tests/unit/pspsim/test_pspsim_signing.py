import hashlib
import hmac

import pytest

from pspsim import signing

SECRET = "whsec_test"
BODY = b'{"id":"evt_1","type":"payment_intent.succeeded"}'
T = 1_800_000_000


def test_sign_matches_hmac_of_t_dot_body():
    header = signing.sign(SECRET, BODY, T)
    expected = hmac.new(SECRET.encode(), f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert header == f"t={T},v1={expected}"


def test_good_signature_verifies():
    assert signing.verify(signing.sign(SECRET, BODY, T), BODY, [SECRET], now=T)


@pytest.mark.parametrize("offset", [-300, -1, 0, 1, 300])
def test_within_tolerance_both_directions(offset):
    assert signing.verify(signing.sign(SECRET, BODY, T), BODY, [SECRET], now=T + offset)


def test_stale_timestamp_refused():
    assert not signing.verify(signing.sign(SECRET, BODY, T), BODY, [SECRET], now=T + 301)


def test_future_timestamp_refused():
    assert not signing.verify(signing.sign(SECRET, BODY, T), BODY, [SECRET], now=T - 301)


def test_custom_tolerance():
    header = signing.sign(SECRET, BODY, T)
    assert signing.verify(header, BODY, [SECRET], tolerance=10, now=T + 10)
    assert not signing.verify(header, BODY, [SECRET], tolerance=10, now=T + 11)


def test_wrong_secret_refused():
    assert not signing.verify(signing.sign("whsec_other", BODY, T), BODY, [SECRET], now=T)


def test_tampered_body_refused():
    assert not signing.verify(signing.sign(SECRET, BODY, T), BODY + b" ", [SECRET], now=T)


def test_tampered_timestamp_refused():
    header = signing.sign(SECRET, BODY, T).replace(f"t={T}", f"t={T + 1}")
    assert not signing.verify(header, BODY, [SECRET], now=T)


def test_any_of_two_v1_values_accepted():
    # Header signed by the old and the new secret (rotation): a receiver knowing either accepts.
    header = signing.sign(["whsec_old", "whsec_new"], BODY, T)
    assert header.count("v1=") == 2
    assert signing.verify(header, BODY, ["whsec_new"], now=T)
    assert signing.verify(header, BODY, ["whsec_old"], now=T)
    assert not signing.verify(header, BODY, ["whsec_other"], now=T)


def test_receiver_with_two_secrets_accepts_either():
    assert signing.verify(signing.sign("b", BODY, T), BODY, ["a", "b"], now=T)
    assert signing.verify(signing.sign("a", BODY, T), BODY, "a", now=T)


def test_bogus_v1_next_to_good_one_accepted():
    good = signing.sign(SECRET, BODY, T)
    header = f"t={T},v1={'0' * 64},{good.split(',')[1]},v0=ignored"
    assert signing.verify(header, BODY, [SECRET], now=T)


@pytest.mark.parametrize(
    "header",
    [None, "", "garbage", f"t={T}", "v1=abc", f"t=abc,v1={'0' * 64}", f"t={T},t={T},v1={'0' * 64}",
     f"t=-{T},v1={'0' * 64}", f"t={T},v1="],
)
def test_malformed_headers_refused(header):
    assert not signing.verify(header, BODY, [SECRET], now=T)


def test_parse():
    assert signing.parse(f"t={T}, v1=AB ,v1=cd,x=1") == (T, ["ab", "cd"])
