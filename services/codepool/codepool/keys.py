"""Code encryption keys: AES-256-GCM at rest, HMAC-SHA256 for duplicates (docs/codepool.md).

`CUTY_CODE_KEYS` holds the keyring in one of the forms of cutylib.keyring (the platform's one
AES-GCM keyring), with the code pool's own option, the hash key:

    k1:<base64 32 bytes>,k2:<base64 32 bytes>;active=k2;hash=<base64 32 bytes>
    {"keys": {"k1": "<base64>", "k2": "<base64>"}, "active": "k2", "hash_key": "<base64>"}

or the path of a file holding the JSON form. `active=` may be left out when there is one key. The
hash key may come from `CUTY_CODE_HASH_KEY` instead; it must never change (duplicates are found by
comparing hashes). Unset, a development keyring is generated once under `CUTY_DATA_DIR`.
"""
from __future__ import annotations

import hmac
import os
import pathlib
import uuid
from dataclasses import dataclass

from cutylib import keyring
from cutylib.keyring import KEY_ID_RE, NONCE_BYTES, AeadKeyring, IntegrityError, KeyringError

__all__ = ["KEY_ID_RE", "NONCE_BYTES", "CodeIntegrityError", "Keyring", "KeyringError", "associated_data",
           "ensure_dev_key_file", "generate_spec"]

DEV_KEY_FILE = "codepool-keys.json"
VARIABLE = "CUTY_CODE_KEYS"


class CodeIntegrityError(Exception):
    """A stored code does not decrypt under its key and associated data (tampered, swapped, wrong key)."""


def associated_data(code_id: bytes, product_id: bytes, key_id: str) -> bytes:
    """What the ciphertext is bound to: moving it to another row, product or key id breaks the tag."""
    return code_id + product_id + key_id.encode()


@dataclass(repr=False)
class Keyring(AeadKeyring):
    hash_key: bytes

    # --- hashing -------------------------------------------------------------------------------
    def code_hash(self, value: str) -> bytes:
        return hmac.digest(self.hash_key, value.encode(), "sha256")

    def hash_fingerprint(self) -> bytes:
        """Identifies the hash key without revealing it (stored in the database at first start)."""
        return hmac.digest(self.hash_key, b"cuty-codepool hash key fingerprint", "sha256")

    # --- encryption ----------------------------------------------------------------------------
    def encrypt(self, code_id: bytes, product_id: bytes, value: str, nonce: bytes | None = None) -> tuple[str, bytes, bytes]:
        """(key id, nonce, ciphertext||tag) under the active key; ids are the 16 raw uuid bytes.
        The associated data is `associated_data(code_id, product_id, key id)`."""
        return self.seal(code_id + product_id, value.encode(), nonce)

    def decrypt(self, code_id: bytes, product_id: bytes, key_id: str, nonce: bytes, ciphertext: bytes) -> str:
        try:
            return self.open(code_id + product_id, key_id, nonce, ciphertext).decode()
        except IntegrityError as e:
            raise CodeIntegrityError(f"code {uuid.UUID(bytes=code_id)} {e}") from None

    # --- loading -------------------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str, *, hash_key_b64: str = "") -> "Keyring":
        """A keyring from the inline or JSON form of `CUTY_CODE_KEYS` (see the module docstring)."""
        parsed = keyring.parse_spec(spec, variable=VARIABLE, options={"hash": "hash_key"})
        hash_b64 = parsed.options.get("hash") or hash_key_b64
        if not hash_b64:
            raise KeyringError("no hash key: add ;hash=<base64 32 bytes> (or \"hash_key\") to CUTY_CODE_KEYS, "
                               "or set CUTY_CODE_HASH_KEY")
        hash_key = keyring.decode_key(hash_b64, "the hash key")
        if any(hmac.compare_digest(hash_key, k) for k in parsed.keys.values()):
            raise KeyringError("the hash key must differ from every encryption key")
        return cls(keys=parsed.keys, active=parsed.active, hash_key=hash_key)

    @classmethod
    def load(cls, code_keys: str, data_dir: str, *, hash_key_b64: str | None = None) -> "Keyring":
        """The keyring from `CUTY_CODE_KEYS` (inline, JSON or a file path), else the dev key file."""
        if hash_key_b64 is None:
            hash_key_b64 = os.environ.get("CUTY_CODE_HASH_KEY", "")
        text = keyring.spec_text(code_keys, data_dir, DEV_KEY_FILE, generate_spec, variable=VARIABLE)
        return cls.parse(text, hash_key_b64=hash_key_b64)


def generate_spec(key_ids: tuple[str, ...] = ("dev1",), active: str | None = None) -> dict:
    """A fresh keyring document (JSON form) with random keys."""
    return {"keys": {kid: keyring.random_key_b64() for kid in key_ids}, "active": active or key_ids[-1],
            "hash_key": keyring.random_key_b64()}


def ensure_dev_key_file(path: pathlib.Path) -> pathlib.Path:
    """Create the development keyring once (0600); see cutylib.keyring.ensure_dev_key_file."""
    return keyring.ensure_dev_key_file(path, generate_spec)
