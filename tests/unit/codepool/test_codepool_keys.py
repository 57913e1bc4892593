"""Keyring formats, AES-GCM binding and the development key file."""
import base64
import json
import os
import uuid

import pytest

from codepool.keys import CodeIntegrityError, Keyring, KeyringError, ensure_dev_key_file


def b64(raw: bytes | None = None) -> str:
    return base64.b64encode(raw or os.urandom(32)).decode()


K1, K2, H = b64(), b64(), b64()
FRAGMENTS = {"name the active one", "not one of", "32 bytes", "base64", "no hash key", "differ", "twice", "key id",
             "option", "malformed"}


def test_inline_form_with_active_and_hash():
    kr = Keyring.parse(f"k1:{K1},k2:{K2};active=k2;hash={H}")
    assert sorted(kr.keys) == ["k1", "k2"] and kr.active == "k2"
    assert kr.hash_key == base64.b64decode(H)


def test_single_key_is_active_and_hash_key_may_come_from_env_value():
    kr = Keyring.parse(f"only:{K1}", hash_key_b64=H)
    assert kr.active == "only"


def test_json_form_and_file_path(tmp_path):
    doc = {"keys": {"a": K1, "b": K2}, "active": "a", "hash_key": H}
    assert Keyring.parse(json.dumps(doc)).active == "a"
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(doc))
    assert sorted(Keyring.load(str(path), str(tmp_path)).keys) == ["a", "b"]


@pytest.mark.parametrize("spec, fragment", [
    (f"k1:{K1},k2:{K2};hash={H}", "name the active one"),
    (f"k1:{K1};active=k9;hash={H}", "not one of"),
    (f"k1:{b64(os.urandom(16))};hash={H}", "32 bytes"),
    (f"k1:not*base64;hash={H}", "base64"),
    (f"k1:{K1}", "no hash key"),
    (f"k1:{K1};hash={K1}", "differ"),
    (f"k1:{K1},k1:{K2};hash={H}", "twice"),
    (f"bad id!:{K1};hash={H}", "key id"),
    (f"k1:{K1};colour=blue;hash={H}", "option"),
    ('{"keys": ', "malformed"),
], ids=lambda v: v if v in FRAGMENTS else "spec")  # the keys are random: name cases by fragment
def test_bad_specs_are_refused_without_echoing_keys(spec, fragment):
    with pytest.raises(KeyringError) as e:
        Keyring.parse(spec)
    assert fragment in str(e.value)
    assert K1 not in str(e.value) and K2 not in str(e.value)


def test_missing_key_file_is_refused(tmp_path):
    with pytest.raises(KeyringError):
        Keyring.load(str(tmp_path / "nope.json"), str(tmp_path))


def test_round_trip_and_binding_to_row_product_and_key():
    kr = Keyring.parse(f"k1:{K1},k2:{K2};active=k2;hash={H}")
    code_id, product = uuid.uuid4().bytes, uuid.uuid4().bytes
    key_id, nonce, ct = kr.encrypt(code_id, product, "ABCD-1234")
    assert key_id == "k2" and len(nonce) == 12 and b"ABCD" not in ct
    assert kr.decrypt(code_id, product, key_id, nonce, ct) == "ABCD-1234"
    for bad in ((uuid.uuid4().bytes, product, key_id), (code_id, uuid.uuid4().bytes, key_id), (code_id, product, "k1"),
                (code_id, product, "k9")):
        with pytest.raises(CodeIntegrityError):
            kr.decrypt(bad[0], bad[1], bad[2], nonce, ct)
    with pytest.raises(CodeIntegrityError):
        kr.decrypt(code_id, product, key_id, nonce, ct[:-1] + bytes([ct[-1] ^ 1]))


def test_nonces_are_fresh_and_hash_is_keyed():
    kr = Keyring.parse(f"k1:{K1};hash={H}")
    nonces = {kr.encrypt(b"\0" * 16, b"\0" * 16, "same")[1] for _ in range(1000)}
    assert len(nonces) == 1000
    other = Keyring.parse(f"k1:{K1};hash={b64()}")
    assert kr.code_hash("X") == kr.code_hash("X") != other.code_hash("X")
    assert K1 not in repr(kr) and H not in repr(kr)


def test_dev_key_file_is_created_once_private_and_reused(tmp_path):
    first = Keyring.load("", str(tmp_path))
    path = tmp_path / "codepool-keys.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = Keyring.load("", str(tmp_path))
    assert first.keys == again.keys and first.hash_key == again.hash_key
    assert ensure_dev_key_file(path) == path and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
